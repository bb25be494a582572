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
/// Makes the calling thread the one that runs `loop` (a context's main loop): pw_loop_enter, held
/// until CBroadcastPW_loopLeave, not around each iteration. libpipewire's data-loop thread hands
/// work to the main loop with pw_loop_invoke, which runs it *at once on the data thread* when no
/// thread has entered the loop: with the loop entered only while iterating, stream and node
/// callbacks ran on the data thread alongside the owner's own calls (issue 13's SIGSEGV). Then
/// waits until `context`'s data loop has finished what it was running (NULL: no context yet), so
/// nothing the data thread began while no thread owned the loop is still running.
void CBroadcastPW_loopEnter(struct pw_loop *loop, struct pw_context *context);
/// Gives the loop up (pw_loop_leave), before another thread takes it with CBroadcastPW_loopEnter.
void CBroadcastPW_loopLeave(struct pw_loop *loop);
/// For tests: pw_loop_invoke(loop, ..., block = false) of a function that sets `*ran` to 1. With
/// the loop owned by another thread it is queued for that thread (`*ran` still 0 on return); with
/// no owner it runs here, at once. `ran` must stay valid until the function has run.
void CBroadcastPW_invokeProbe(struct pw_loop *loop, int *ran);
/// For tests: whether the probe set its flag (an atomic load).
int CBroadcastPW_probeRan(const int *ran);
/// SPA_RESULT_IS_ERROR / spa_strerror: a readable text for a negative SPA/PipeWire result.
const char *CBroadcastPW_strerror(int result);
#include "CPipeWireVideo.h"
#include "CPipeWireAudio.h"
