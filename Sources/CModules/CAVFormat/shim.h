#pragma once
#include <libavformat/avformat.h>
