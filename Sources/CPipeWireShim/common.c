#include "CPipeWireShim.h"
#include <pthread.h>
#include <spa/utils/result.h>
#include <pipewire/data-loop.h>

static pthread_once_t pw_once = PTHREAD_ONCE_INIT;
static void pw_init_once(void) { pw_init(NULL, NULL); }

void CBroadcastPW_init(void) { pthread_once(&pw_once, pw_init_once); }

struct pw_properties *CBroadcastPW_properties(const char *const *keys, const char *const *values, size_t count) {
    struct pw_properties *props = pw_properties_new(NULL, NULL);
    if (props == NULL) return NULL;
    for (size_t i = 0; i < count; i++) pw_properties_set(props, keys[i], values[i]);
    return props;
}

const char *CBroadcastPW_strerror(int result) { return spa_strerror(result); }

static int nothing(struct spa_loop *loop, bool async, uint32_t seq, const void *data, size_t size, void *user_data) {
    (void)loop; (void)async; (void)seq; (void)data; (void)size; (void)user_data;
    return 0;
}

void CBroadcastPW_loopEnter(struct pw_loop *loop, struct pw_context *context) {
    pw_loop_enter(loop);
    struct pw_data_loop *data = context ? pw_context_get_data_loop(context) : NULL;
    // Blocks until the data thread has dispatched this: whatever it was running is over.
    if (data) pw_data_loop_invoke(data, nothing, SPA_ID_INVALID, NULL, 0, true, NULL);
}

void CBroadcastPW_loopLeave(struct pw_loop *loop) { pw_loop_leave(loop); }

static int mark(struct spa_loop *loop, bool async, uint32_t seq, const void *data, size_t size, void *user_data) {
    (void)loop; (void)async; (void)seq; (void)data; (void)size;
    __atomic_store_n((int *)user_data, 1, __ATOMIC_SEQ_CST);
    return 0;
}

void CBroadcastPW_invokeProbe(struct pw_loop *loop, int *ran) {
    pw_loop_invoke(loop, mark, SPA_ID_INVALID, NULL, 0, false, ran);
}

int CBroadcastPW_probeRan(const int *ran) { return __atomic_load_n(ran, __ATOMIC_SEQ_CST); }
