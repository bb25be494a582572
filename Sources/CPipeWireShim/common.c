#include "CPipeWireShim.h"
#include <pthread.h>
#include <spa/utils/result.h>

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
