// Video capture through PipeWire; see include/CPipeWireVideo.h.
#include "CPipeWireShim.h"
#include "CPipeWireVideo.h"
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <pipewire/pipewire.h>
#include <spa/param/video/format-utils.h>
#include <spa/param/buffers.h>
#include <spa/buffer/meta.h>
#include <spa/pod/builder.h>
#include <spa/utils/result.h>

#define CURSOR_META_SIZE(w, h) \
    (sizeof(struct spa_meta_cursor) + sizeof(struct spa_meta_bitmap) + (w) * (h) * 4)
#define DAMAGE_REGIONS 16

struct CBroadcastPWVideo {
    struct pw_loop *loop;
    struct pw_context *context;
    struct pw_core *core;
    struct spa_hook coreListener;
    struct pw_stream *stream;
    struct spa_hook streamListener;
    int state;
    int everConnected;
    char error[256];
    int wantCursorMeta;
    struct spa_video_info_raw info;
    uint32_t formatChanges;
    struct pw_buffer *held;
    struct pw_registry *registry;
    struct spa_hook registryListener;
    uint32_t watchedNode;
    /// The thread that has the loop entered (CBroadcastPW_loopEnter), if any: the one that may call in.
    int owned;
    pthread_t owner;
};

static uint32_t to_spa(int f) {
    switch (f) {
    case CBroadcastPWVideoFormat_BGRx: return SPA_VIDEO_FORMAT_BGRx;
    case CBroadcastPWVideoFormat_RGBx: return SPA_VIDEO_FORMAT_RGBx;
    case CBroadcastPWVideoFormat_BGRA: return SPA_VIDEO_FORMAT_BGRA;
    case CBroadcastPWVideoFormat_RGBA: return SPA_VIDEO_FORMAT_RGBA;
    case CBroadcastPWVideoFormat_xRGB: return SPA_VIDEO_FORMAT_xRGB;
    case CBroadcastPWVideoFormat_xBGR: return SPA_VIDEO_FORMAT_xBGR;
    case CBroadcastPWVideoFormat_ARGB: return SPA_VIDEO_FORMAT_ARGB;
    case CBroadcastPWVideoFormat_ABGR: return SPA_VIDEO_FORMAT_ABGR;
    case CBroadcastPWVideoFormat_YUY2: return SPA_VIDEO_FORMAT_YUY2;
    case CBroadcastPWVideoFormat_UYVY: return SPA_VIDEO_FORMAT_UYVY;
    default: return SPA_VIDEO_FORMAT_UNKNOWN;
    }
}

static uint32_t from_spa(uint32_t f) {
    for (int i = CBroadcastPWVideoFormat_BGRx; i <= CBroadcastPWVideoFormat_UYVY; i++)
        if (to_spa(i) == f) return (uint32_t)i;
    return CBroadcastPWVideoFormat_unknown;
}

static void set_lost(struct CBroadcastPWVideo *v, const char *why) {
    if (v->state == CBroadcastPWVideoState_lost) return;
    v->state = CBroadcastPWVideoState_lost;
    snprintf(v->error, sizeof v->error, "%s", why && *why ? why : "stream ended");
}

static void on_core_error(void *data, uint32_t id, int seq, int res, const char *message) {
    (void)seq;
    struct CBroadcastPWVideo *v = data;
    if (id == PW_ID_CORE) {
        char text[256];
        snprintf(text, sizeof text, "PipeWire connection lost: %s (%s)", message ? message : "", spa_strerror(res));
        set_lost(v, text);
    }
}

static const struct pw_core_events core_events = {
    PW_VERSION_CORE_EVENTS,
    .error = on_core_error,
};

static void on_global_remove(void *data, uint32_t id) {
    struct CBroadcastPWVideo *v = data;
    if (id == v->watchedNode) set_lost(v, "the PipeWire node went away");
}

static const struct pw_registry_events watch_events = { PW_VERSION_REGISTRY_EVENTS, .global_remove = on_global_remove };

static void on_state_changed(void *data, enum pw_stream_state old, enum pw_stream_state state, const char *error) {
    (void)old;
    struct CBroadcastPWVideo *v = data;
    switch (state) {
    case PW_STREAM_STATE_ERROR:
        set_lost(v, error ? error : "stream error");
        break;
    case PW_STREAM_STATE_UNCONNECTED:
        if (v->everConnected) set_lost(v, error ? error : "the node went away");
        break;
    case PW_STREAM_STATE_CONNECTING:
        break;
    case PW_STREAM_STATE_PAUSED:
        v->everConnected = 1;
        if (v->state != CBroadcastPWVideoState_lost) v->state = CBroadcastPWVideoState_paused;
        break;
    case PW_STREAM_STATE_STREAMING:
        v->everConnected = 1;
        if (v->state != CBroadcastPWVideoState_lost) v->state = CBroadcastPWVideoState_streaming;
        break;
    }
}

static void on_param_changed(void *data, uint32_t id, const struct spa_pod *param) {
    struct CBroadcastPWVideo *v = data;
    if (id != SPA_PARAM_Format || param == NULL) return;
    uint32_t mediaType, mediaSubtype;
    if (spa_format_parse(param, &mediaType, &mediaSubtype) < 0) return;
    if (mediaType != SPA_MEDIA_TYPE_video || mediaSubtype != SPA_MEDIA_SUBTYPE_raw) return;
    struct spa_video_info_raw info;
    spa_zero(info);
    if (spa_format_video_raw_parse(param, &info) < 0) return;
    v->info = info;
    v->formatChanges++;

    uint8_t buffer[1024];
    struct spa_pod_builder b = SPA_POD_BUILDER_INIT(buffer, sizeof buffer);
    const struct spa_pod *params[5];
    uint32_t n = 0;
    // Shared memory only: without a GPU context there is nothing to import a DMA-BUF into.
    params[n++] = spa_pod_builder_add_object(&b, SPA_TYPE_OBJECT_ParamBuffers, SPA_PARAM_Buffers,
        SPA_PARAM_BUFFERS_buffers, SPA_POD_CHOICE_RANGE_Int(4, 2, 16),
        SPA_PARAM_BUFFERS_blocks, SPA_POD_Int(1),
        SPA_PARAM_BUFFERS_dataType, SPA_POD_CHOICE_FLAGS_Int((1 << SPA_DATA_MemFd) | (1 << SPA_DATA_MemPtr)));
    params[n++] = spa_pod_builder_add_object(&b, SPA_TYPE_OBJECT_ParamMeta, SPA_PARAM_Meta,
        SPA_PARAM_META_type, SPA_POD_Id(SPA_META_Header),
        SPA_PARAM_META_size, SPA_POD_Int(sizeof(struct spa_meta_header)));
    params[n++] = spa_pod_builder_add_object(&b, SPA_TYPE_OBJECT_ParamMeta, SPA_PARAM_Meta,
        SPA_PARAM_META_type, SPA_POD_Id(SPA_META_VideoCrop),
        SPA_PARAM_META_size, SPA_POD_Int(sizeof(struct spa_meta_region)));
    params[n++] = spa_pod_builder_add_object(&b, SPA_TYPE_OBJECT_ParamMeta, SPA_PARAM_Meta,
        SPA_PARAM_META_type, SPA_POD_Id(SPA_META_VideoDamage),
        SPA_PARAM_META_size, SPA_POD_CHOICE_RANGE_Int(sizeof(struct spa_meta_region) * DAMAGE_REGIONS,
                                                      sizeof(struct spa_meta_region) * 1,
                                                      sizeof(struct spa_meta_region) * DAMAGE_REGIONS));
    if (v->wantCursorMeta)
        params[n++] = spa_pod_builder_add_object(&b, SPA_TYPE_OBJECT_ParamMeta, SPA_PARAM_Meta,
            SPA_PARAM_META_type, SPA_POD_Id(SPA_META_Cursor),
            SPA_PARAM_META_size, SPA_POD_CHOICE_RANGE_Int(CURSOR_META_SIZE(64, 64), CURSOR_META_SIZE(1, 1),
                                                          CURSOR_META_SIZE(256, 256)));
    pw_stream_update_params(v->stream, params, n);
}

static void on_process(void *data) { (void)data; /* buffers are taken by CBroadcastPWVideo_acquire */ }

static const struct pw_stream_events stream_events = {
    PW_VERSION_STREAM_EVENTS,
    .state_changed = on_state_changed,
    .param_changed = on_param_changed,
    .process = on_process,
};

static const struct spa_pod *format_offer(struct spa_pod_builder *b) {
    struct spa_pod_frame f[2];
    spa_pod_builder_push_object(b, &f[0], SPA_TYPE_OBJECT_Format, SPA_PARAM_EnumFormat);
    spa_pod_builder_add(b, SPA_FORMAT_mediaType, SPA_POD_Id(SPA_MEDIA_TYPE_video), 0);
    spa_pod_builder_add(b, SPA_FORMAT_mediaSubtype, SPA_POD_Id(SPA_MEDIA_SUBTYPE_raw), 0);
    spa_pod_builder_prop(b, SPA_FORMAT_VIDEO_format, 0);
    spa_pod_builder_push_choice(b, &f[1], SPA_CHOICE_Enum, 0);
    spa_pod_builder_id(b, SPA_VIDEO_FORMAT_BGRx);  // the default
    for (int i = CBroadcastPWVideoFormat_BGRx; i <= CBroadcastPWVideoFormat_UYVY; i++) spa_pod_builder_id(b, to_spa(i));
    spa_pod_builder_pop(b, &f[1]);
    spa_pod_builder_add(b, SPA_FORMAT_VIDEO_size,
        SPA_POD_CHOICE_RANGE_Rectangle(&SPA_RECTANGLE(1920, 1080), &SPA_RECTANGLE(1, 1), &SPA_RECTANGLE(16384, 16384)), 0);
    spa_pod_builder_add(b, SPA_FORMAT_VIDEO_framerate,
        SPA_POD_CHOICE_RANGE_Fraction(&SPA_FRACTION(0, 1), &SPA_FRACTION(0, 1), &SPA_FRACTION(360, 1)), 0);
    return spa_pod_builder_pop(b, &f[0]);
}

CBroadcastPWVideo *CBroadcastPWVideo_open(int fd, const char *target, uint32_t nodeID, int wantCursorMeta,
                                          const char *name, char *error, size_t errorSize) {
    CBroadcastPW_init();
    struct CBroadcastPWVideo *v = calloc(1, sizeof *v);
    if (v == NULL) { snprintf(error, errorSize, "out of memory"); if (fd >= 0) close(fd); return NULL; }
    v->wantCursorMeta = wantCursorMeta;
    v->loop = pw_loop_new(NULL);
    if (v->loop == NULL) { snprintf(error, errorSize, "cannot create a PipeWire loop"); goto fail_fd; }
    v->context = pw_context_new(v->loop, NULL, 0);
    if (v->context == NULL) { snprintf(error, errorSize, "cannot create a PipeWire context"); goto fail_fd; }
    // The opening thread owns the loop from here on (until CBroadcastPWVideo_leave).
    CBroadcastPWVideo_enter(v);
    v->core = fd >= 0 ? pw_context_connect_fd(v->context, fd, NULL, 0) : pw_context_connect(v->context, NULL, 0);
    fd = -1;  // owned by the core now (closed on failure too)
    if (v->core == NULL) {
        snprintf(error, errorSize, "cannot connect to PipeWire: %s", strerror(errno));
        goto fail;
    }
    pw_core_add_listener(v->core, &v->coreListener, &core_events, v);
    // The node going away (the compositor ended the cast, a camera unplugged) does not always end
    // the stream (it may just pause): watch the registry for its removal.
    v->watchedNode = nodeID;
    if (nodeID != PW_ID_ANY) {
        v->registry = pw_core_get_registry(v->core, PW_VERSION_REGISTRY, 0);
        if (v->registry) pw_registry_add_listener(v->registry, &v->registryListener, &watch_events, v);
    }
    struct pw_properties *props = pw_properties_new(
        PW_KEY_MEDIA_TYPE, "Video", PW_KEY_MEDIA_CATEGORY, "Capture", PW_KEY_MEDIA_ROLE, "Screen", NULL);
    if (target != NULL && *target) pw_properties_set(props, PW_KEY_TARGET_OBJECT, target);
    v->stream = pw_stream_new(v->core, name ? name : "broadcast video", props);
    if (v->stream == NULL) { snprintf(error, errorSize, "cannot create a PipeWire stream: %s", strerror(errno)); goto fail; }
    pw_stream_add_listener(v->stream, &v->streamListener, &stream_events, v);
    uint8_t buffer[1024];
    struct spa_pod_builder b = SPA_POD_BUILDER_INIT(buffer, sizeof buffer);
    const struct spa_pod *params[1] = { format_offer(&b) };
    int res = pw_stream_connect(v->stream, PW_DIRECTION_INPUT, nodeID,
                                PW_STREAM_FLAG_AUTOCONNECT | PW_STREAM_FLAG_MAP_BUFFERS, params, 1);
    if (res < 0) { snprintf(error, errorSize, "cannot connect the PipeWire stream: %s", spa_strerror(res)); goto fail; }
    v->state = CBroadcastPWVideoState_connecting;
    return v;
fail_fd:
    if (fd >= 0) close(fd);
    CBroadcastPWVideo_close(v);
    return NULL;
fail:
    CBroadcastPWVideo_close(v);
    return NULL;
}

int CBroadcastPWVideo_enter(CBroadcastPWVideo *v) {
    if (v->owned) return pthread_equal(v->owner, pthread_self()) ? 0 : -1;
    CBroadcastPW_loopEnter(v->loop, v->context);
    v->owner = pthread_self();
    v->owned = 1;
    return 0;
}

void CBroadcastPWVideo_leave(CBroadcastPWVideo *v) {
    if (!v->owned || !pthread_equal(v->owner, pthread_self())) return;
    v->owned = 0;
    CBroadcastPW_loopLeave(v->loop);
}

struct pw_loop *CBroadcastPWVideo_loop(CBroadcastPWVideo *v) { return v->loop; }

int CBroadcastPWVideo_iterate(CBroadcastPWVideo *v, int timeoutMs) {
    if (CBroadcastPWVideo_enter(v) < 0) return -EBUSY;
    int res = pw_loop_iterate(v->loop, timeoutMs);
    if (res < 0 && res != -EINTR) return res;
    return 0;
}

int CBroadcastPWVideo_state(const CBroadcastPWVideo *v) { return v->state; }
const char *CBroadcastPWVideo_error(const CBroadcastPWVideo *v) { return v->error; }
uint32_t CBroadcastPWVideo_formatChanges(const CBroadcastPWVideo *v) { return v->formatChanges; }

/// Adds a buffer's SPA_META_VideoDamage regions to the running bounding box; 0 when it has none.
static int add_damage(struct spa_buffer *buf, int32_t *x0, int32_t *y0, int32_t *x1, int32_t *y1) {
    struct spa_meta *damage = spa_buffer_find_meta(buf, SPA_META_VideoDamage);
    if (!damage) return 0;
    int regions = 0;
    struct spa_meta_region *r;
    spa_meta_for_each(r, damage) {
        if (!spa_meta_region_is_valid(r)) break;
        regions++;
        int32_t rx = r->region.position.x, ry = r->region.position.y;
        if (rx < *x0) *x0 = rx;
        if (ry < *y0) *y0 = ry;
        if (rx + (int32_t)r->region.size.width > *x1) *x1 = rx + (int32_t)r->region.size.width;
        if (ry + (int32_t)r->region.size.height > *y1) *y1 = ry + (int32_t)r->region.size.height;
    }
    return regions;
}

int CBroadcastPWVideo_acquire(CBroadcastPWVideo *v, CBroadcastPWVideoFrame *frame) {
    if (v->stream == NULL) return 0;
    CBroadcastPWVideo_release(v);
    struct pw_buffer *newest = NULL, *b;
    // The damage of every buffer taken here, the superseded ones too: the newest one's damage is
    // relative to the buffer before it, which we may never have looked at.
    int32_t x0 = INT32_MAX, y0 = INT32_MAX, x1 = INT32_MIN, y1 = INT32_MIN;
    uint32_t regions = 0;
    int damageComplete = 1;
    while ((b = pw_stream_dequeue_buffer(v->stream)) != NULL) {
        if (newest) pw_stream_queue_buffer(v->stream, newest);
        newest = b;
        int n = add_damage(b->buffer, &x0, &y0, &x1, &y1);
        if (n == 0) damageComplete = 0;
        regions += (uint32_t)n;
    }
    if (newest == NULL) return 0;
    v->held = newest;
    memset(frame, 0, sizeof *frame);
    struct spa_buffer *buf = newest->buffer;
    frame->format = from_spa(v->info.format);
    frame->width = v->info.size.width;
    frame->height = v->info.size.height;
    frame->pts = -1;
    if (buf->n_datas > 0) {
        struct spa_data *d = &buf->datas[0];
        frame->dataType = d->type;
        if (d->data != NULL && d->chunk != NULL && d->maxsize > 0) {
            uint32_t offset = d->chunk->offset % d->maxsize;
            uint32_t size = d->chunk->size;
            if (size > d->maxsize - offset) size = d->maxsize - offset;
            frame->data = (const uint8_t *)d->data + offset;
            frame->size = size;
            frame->stride = d->chunk->stride;
            frame->chunkFlags = d->chunk->flags;
        }
    }
    struct spa_meta_header *h = spa_buffer_find_meta_data(buf, SPA_META_Header, sizeof *h);
    if (h) {
        frame->headerFlags = h->flags;
        frame->pts = h->pts;
    }
    frame->corrupted = (h && (h->flags & SPA_META_HEADER_FLAG_CORRUPTED)) || (frame->chunkFlags & SPA_CHUNK_FLAG_CORRUPTED);
    struct spa_meta_region *crop = spa_buffer_find_meta_data(buf, SPA_META_VideoCrop, sizeof *crop);
    if (crop && spa_meta_region_is_valid(crop)) {
        frame->hasCrop = 1;
        frame->cropX = crop->region.position.x;
        frame->cropY = crop->region.position.y;
        frame->cropWidth = crop->region.size.width;
        frame->cropHeight = crop->region.size.height;
    }
    struct spa_meta_cursor *cursor = spa_buffer_find_meta_data(buf, SPA_META_Cursor, sizeof *cursor);
    if (cursor && spa_meta_cursor_is_valid(cursor)) {
        frame->hasCursor = 1;
        frame->cursorX = cursor->position.x;
        frame->cursorY = cursor->position.y;
        frame->hotX = cursor->hotspot.x;
        frame->hotY = cursor->hotspot.y;
        if (cursor->bitmap_offset >= sizeof *cursor) {
            struct spa_meta_bitmap *bitmap = SPA_PTROFF(cursor, cursor->bitmap_offset, struct spa_meta_bitmap);
            if (bitmap->size.width > 0 && bitmap->size.height > 0 && bitmap->offset >= sizeof *bitmap) {
                frame->hasBitmap = 1;
                frame->bitmapFormat = from_spa(bitmap->format);
                frame->bitmapWidth = bitmap->size.width;
                frame->bitmapHeight = bitmap->size.height;
                frame->bitmapStride = bitmap->stride;
                frame->bitmapData = SPA_PTROFF(bitmap, bitmap->offset, const uint8_t);
            }
        }
    }
    if (damageComplete && regions > 0) {
        frame->damageRegions = regions;
        frame->damageX = x0;
        frame->damageY = y0;
        frame->damageWidth = (uint32_t)(x1 - x0);
        frame->damageHeight = (uint32_t)(y1 - y0);
    }
    return 1;
}

void CBroadcastPWVideo_release(CBroadcastPWVideo *v) {
    if (v->held && v->stream) pw_stream_queue_buffer(v->stream, v->held);
    v->held = NULL;
}

void CBroadcastPWVideo_close(CBroadcastPWVideo *v) {
    if (v == NULL) return;
    // Taken by the closing thread if no thread has it (a source closed before it was started).
    if (v->loop && v->context) CBroadcastPWVideo_enter(v);
    if (v->stream) {
        CBroadcastPWVideo_release(v);
        spa_hook_remove(&v->streamListener);
        pw_stream_disconnect(v->stream);
        pw_stream_destroy(v->stream);
    }
    if (v->registry) {
        spa_hook_remove(&v->registryListener);
        pw_proxy_destroy((struct pw_proxy *)v->registry);
    }
    if (v->core) {
        spa_hook_remove(&v->coreListener);
        pw_core_disconnect(v->core);
    }
    if (v->context) pw_context_destroy(v->context);
    if (v->loop) {
        CBroadcastPWVideo_leave(v);
        pw_loop_destroy(v->loop);
    }
    free(v);
}

// MARK: node listing

struct node_list {
    const char *prefix;
    CBroadcastPWNode *nodes;
    int capacity;
    int count;
    int done;
    int seq;
};

static void copy_text(char *dst, size_t size, const char *src) { snprintf(dst, size, "%s", src ? src : ""); }

static void on_global(void *data, uint32_t id, uint32_t permissions, const char *type, uint32_t version,
                      const struct spa_dict *props) {
    (void)permissions; (void)version;
    struct node_list *list = data;
    if (strcmp(type, PW_TYPE_INTERFACE_Node) != 0 || props == NULL) return;
    const char *cls = spa_dict_lookup(props, PW_KEY_MEDIA_CLASS);
    if (cls == NULL || strncmp(cls, list->prefix, strlen(list->prefix)) != 0) return;
    if (list->count < list->capacity) {
        CBroadcastPWNode *n = &list->nodes[list->count];
        memset(n, 0, sizeof *n);
        n->id = id;
        const char *serial = spa_dict_lookup(props, PW_KEY_OBJECT_SERIAL);
        n->serial = serial ? strtoull(serial, NULL, 10) : 0;
        copy_text(n->name, sizeof n->name, spa_dict_lookup(props, PW_KEY_NODE_NAME));
        const char *description = spa_dict_lookup(props, PW_KEY_NODE_DESCRIPTION);
        if (description == NULL) description = spa_dict_lookup(props, PW_KEY_MEDIA_NAME);
        copy_text(n->description, sizeof n->description, description);
        copy_text(n->mediaClass, sizeof n->mediaClass, cls);
    }
    list->count++;
}

static const struct pw_registry_events registry_events = { PW_VERSION_REGISTRY_EVENTS, .global = on_global };

static void on_done(void *data, uint32_t id, int seq) {
    struct node_list *list = data;
    if (id == PW_ID_CORE && seq == list->seq) list->done = 1;
}

static void on_list_error(void *data, uint32_t id, int seq, int res, const char *message) {
    (void)seq; (void)res; (void)message;
    struct node_list *list = data;
    if (id == PW_ID_CORE) list->done = -1;
}

static const struct pw_core_events list_core_events = { PW_VERSION_CORE_EVENTS, .done = on_done, .error = on_list_error };

int CBroadcastPW_listNodes(const char *classPrefix, CBroadcastPWNode *nodes, int capacity) {
    CBroadcastPW_init();
    struct pw_loop *loop = pw_loop_new(NULL);
    if (loop == NULL) return -1;
    struct pw_context *context = pw_context_new(loop, NULL, 0);
    if (context == NULL) { pw_loop_destroy(loop); return -1; }
    CBroadcastPW_loopEnter(loop, context);
    int result = -1;
    struct pw_core *core = pw_context_connect(context, NULL, 0);
    if (core != NULL) {
        struct node_list list = { .prefix = classPrefix, .nodes = nodes, .capacity = capacity };
        struct spa_hook coreListener, registryListener;
        spa_zero(coreListener);
        spa_zero(registryListener);
        pw_core_add_listener(core, &coreListener, &list_core_events, &list);
        struct pw_registry *registry = pw_core_get_registry(core, PW_VERSION_REGISTRY, 0);
        pw_registry_add_listener(registry, &registryListener, &registry_events, &list);
        list.seq = pw_core_sync(core, PW_ID_CORE, 0);
        for (int i = 0; i < 40 && list.done == 0; i++) pw_loop_iterate(loop, 50);
        if (list.done == 1) result = list.count;
        spa_hook_remove(&registryListener);
        spa_hook_remove(&coreListener);
        pw_proxy_destroy((struct pw_proxy *)registry);
        pw_core_disconnect(core);
    }
    pw_context_destroy(context);
    CBroadcastPW_loopLeave(loop);
    pw_loop_destroy(loop);
    return result;
}

const char *CBroadcastPW_libraryVersion(void) { return pw_get_library_version(); }
