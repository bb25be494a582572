#pragma once
// libpipewire-0.3 and the SPA headers it uses. SPA's function-like macros and variadic
// builders are wrapped by the CPipeWireShim target, not here.
#include <pipewire/pipewire.h>
#include <spa/param/video/format-utils.h>
#include <spa/param/audio/format-utils.h>
#include <spa/param/props.h>
#include <spa/buffer/meta.h>
#include <spa/utils/result.h>
#include <spa/debug/types.h>
