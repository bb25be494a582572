#pragma once
#include <libswscale/swscale.h>
