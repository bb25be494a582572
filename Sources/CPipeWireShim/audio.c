#include "CPipeWireAudio.h"
#include <stdio.h>
#include <spa/param/audio/format-utils.h>
#include <spa/pod/builder.h>
#include <spa/utils/dict.h>

const struct spa_pod *CBroadcastPWAudio_format(uint8_t *buffer, uint32_t size, uint32_t rate, uint32_t channels) {
    struct spa_pod_builder builder = SPA_POD_BUILDER_INIT(buffer, size);
    struct spa_audio_info_raw info = {0};
    info.format = SPA_AUDIO_FORMAT_F32;
    info.rate = rate;
    info.channels = channels;
    if (channels == 1) {
        info.position[0] = SPA_AUDIO_CHANNEL_MONO;
    } else {
        info.position[0] = SPA_AUDIO_CHANNEL_FL;
        info.position[1] = SPA_AUDIO_CHANNEL_FR;
    }
    return spa_format_audio_raw_build(&builder, SPA_PARAM_EnumFormat, &info);
}

int CBroadcastPWAudio_parse_format(const struct spa_pod *param, uint32_t *format, uint32_t *rate, uint32_t *channels) {
    uint32_t media_type, media_subtype;
    if (param == NULL || spa_format_parse(param, &media_type, &media_subtype) < 0) return -1;
    if (media_type != SPA_MEDIA_TYPE_audio || media_subtype != SPA_MEDIA_SUBTYPE_raw) return -1;
    struct spa_audio_info_raw info = {0};
    if (spa_format_audio_raw_parse(param, &info) < 0) return -1;
    *format = info.format;
    *rate = info.rate;
    *channels = info.channels;
    return 0;
}

int CBroadcastPWAudio_is_f32(uint32_t format) { return format == SPA_AUDIO_FORMAT_F32; }

const char *CBroadcastPWAudio_lookup(const struct spa_dict *dict, const char *key) {
    return dict == NULL ? NULL : spa_dict_lookup(dict, key);
}

struct pw_registry *CBroadcastPWAudio_registry(struct pw_core *core, struct spa_hook *hook,
    const struct pw_registry_events *events, void *data) {
    struct pw_registry *registry = pw_core_get_registry(core, PW_VERSION_REGISTRY, 0);
    if (registry != NULL) pw_registry_add_listener(registry, hook, events, data);
    return registry;
}

int CBroadcastPWAudio_core_listen(struct pw_core *core, struct spa_hook *hook, const struct pw_core_events *events, void *data) {
    return pw_core_add_listener(core, hook, events, data);
}

int CBroadcastPWAudio_core_sync(struct pw_core *core, int seq) { return pw_core_sync(core, PW_ID_CORE, seq); }

struct pw_metadata *CBroadcastPWAudio_bind_metadata(struct pw_registry *registry, uint32_t id, struct spa_hook *hook,
    const struct pw_metadata_events *events, void *data) {
    struct pw_metadata *metadata = pw_registry_bind(registry, id, PW_TYPE_INTERFACE_Metadata, PW_VERSION_METADATA, 0);
    if (metadata != NULL) pw_metadata_add_listener(metadata, hook, events, data);
    return metadata;
}

struct pw_proxy *CBroadcastPWAudio_link(struct pw_core *core, uint32_t output_node, uint32_t output_port,
    uint32_t input_node, uint32_t input_port) {
    char out_node[16], out_port[16], in_node[16], in_port[16];
    snprintf(out_node, sizeof out_node, "%u", output_node);
    snprintf(out_port, sizeof out_port, "%u", output_port);
    snprintf(in_node, sizeof in_node, "%u", input_node);
    snprintf(in_port, sizeof in_port, "%u", input_port);
    struct pw_properties *props = pw_properties_new(
        PW_KEY_LINK_OUTPUT_NODE, out_node, PW_KEY_LINK_OUTPUT_PORT, out_port,
        PW_KEY_LINK_INPUT_NODE, in_node, PW_KEY_LINK_INPUT_PORT, in_port,
        PW_KEY_OBJECT_LINGER, "false", NULL);
    if (props == NULL) return NULL;
    struct pw_proxy *proxy = pw_core_create_object(core, "link-factory", PW_TYPE_INTERFACE_Link, PW_VERSION_LINK,
        &props->dict, 0);
    pw_properties_free(props);
    return proxy;
}

int CBroadcastPWAudio_loop_iterate(struct pw_loop *loop, int timeout_ms) { return pw_loop_iterate(loop, timeout_ms); }

#include <spa/param/buffers.h>
const struct spa_pod *CBroadcastPWAudio_buffers(uint8_t *buffer, uint32_t size, int32_t count, int32_t bytes, int32_t stride) {
    struct spa_pod_builder builder = SPA_POD_BUILDER_INIT(buffer, size);
    return spa_pod_builder_add_object(&builder, SPA_TYPE_OBJECT_ParamBuffers, SPA_PARAM_Buffers,
        SPA_PARAM_BUFFERS_buffers, SPA_POD_CHOICE_RANGE_Int(count, 2, count),
        SPA_PARAM_BUFFERS_blocks, SPA_POD_Int(1),
        SPA_PARAM_BUFFERS_size, SPA_POD_CHOICE_RANGE_Int(bytes, stride * 16, INT32_MAX),
        SPA_PARAM_BUFFERS_stride, SPA_POD_Int(stride));
}
