// What Swift cannot import from libpipewire and SPA: variadic functions and function-like macros
// (pod builders, property lists), each as a plain prefixed C function. One header per area
// (video, audio, ...) beside this one; this header holds what all of them share.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <pipewire/pipewire.h>

/// pw_init once per process (safe to call from any thread, any number of times).
void CBroadcastPW_init(void);
/// pw_properties_new(key, value, ..., NULL) from two parallel arrays of `count` C strings.
struct pw_properties *CBroadcastPW_properties(const char *const *keys, const char *const *values, size_t count);
/// SPA_RESULT_IS_ERROR / spa_strerror: a readable text for a negative SPA/PipeWire result.
const char *CBroadcastPW_strerror(int result);
#include "CPipeWireVideo.h"
#include "CPipeWireAudio.h"
