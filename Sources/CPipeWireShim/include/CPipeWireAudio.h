// PipeWire audio capture (BroadcastCapture's PipeWireAudioSource and the device listing): the
// macros and variadic builders it needs, each a plain prefixed C function.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <pipewire/pipewire.h>
#include <pipewire/extensions/metadata.h>

/// An EnumFormat pod for interleaved 32-bit float audio at `rate` Hz, 1 or 2 channels (MONO or
/// FL FR), built into `buffer`; NULL when it does not fit.
const struct spa_pod *CBroadcastPWAudio_format(uint8_t *buffer, uint32_t size, uint32_t rate, uint32_t channels);
/// Reads a negotiated audio/raw Format pod; 0 on success, with the SPA_AUDIO_FORMAT_*, rate and channels.
int CBroadcastPWAudio_parse_format(const struct spa_pod *param, uint32_t *format, uint32_t *rate, uint32_t *channels);
/// True when `format` is SPA_AUDIO_FORMAT_F32 (interleaved, native endian).
int CBroadcastPWAudio_is_f32(uint32_t format);

/// spa_dict_lookup: the value of `key` or NULL.
const char *CBroadcastPWAudio_lookup(const struct spa_dict *dict, const char *key);

/// pw_core_get_registry + pw_registry_add_listener.
struct pw_registry *CBroadcastPWAudio_registry(struct pw_core *core, struct spa_hook *hook,
    const struct pw_registry_events *events, void *data);
/// pw_core_add_listener.
int CBroadcastPWAudio_core_listen(struct pw_core *core, struct spa_hook *hook, const struct pw_core_events *events, void *data);
/// pw_core_sync(core, PW_ID_CORE, seq): a `done` event with the returned sequence number follows
/// every event the server sent before it.
int CBroadcastPWAudio_core_sync(struct pw_core *core, int seq);
/// Binds the metadata object `id` and listens to its properties.
struct pw_metadata *CBroadcastPWAudio_bind_metadata(struct pw_registry *registry, uint32_t id, struct spa_hook *hook,
    const struct pw_metadata_events *events, void *data);
/// A link from output port `output_port` of node `output_node` to input port `input_port` of
/// node `input_node` (ids), owned by this client (gone when the proxy is destroyed or the client disconnects).
struct pw_proxy *CBroadcastPWAudio_link(struct pw_core *core, uint32_t output_node, uint32_t output_port,
    uint32_t input_node, uint32_t input_port);

/// pw_loop_iterate (wait at most `timeout_ms`; dispatches what is ready), on the thread that
/// entered the loop (CBroadcastPW_loopEnter).
int CBroadcastPWAudio_loop_iterate(struct pw_loop *loop, int timeout_ms);
/// A Buffers param asking for `count` buffers (at least 2, at most `count`) of up to `size` bytes,
/// so a capture thread that runs late for a while finds the cycles queued instead of dropped.
const struct spa_pod *CBroadcastPWAudio_buffers(uint8_t *buffer, uint32_t size, int32_t count, int32_t bytes, int32_t stride);
