#pragma once
#include <libswresample/swresample.h>
