// The WHIP output's C side: one WebRTC peer connection on GStreamer's webrtcbin (appsrc → RTP
// payloader → webrtcbin, send-only) and the HTTP requests of RFC 9725 on libcurl. Plain C types
// only: Swift never sees GObject. A peer is used by one thread (the output's); GStreamer's own
// threads (streaming, libnice, webrtcbin's) only bump atomic counters the owner reads.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct CBroadcastWHIPPeer CBroadcastWHIPPeer;

/// Asked about ten times a second while a call waits (ICE gathering, an HTTP answer), on the
/// caller's thread: non-zero abandons the call (the output is stopping). May be NULL.
typedef int (*CBroadcastAbandonCheck)(void *context);

/// Connection states as the output needs them (webrtcbin's connection-state folded).
enum {
    CBroadcastWHIPState_connecting = 0,
    CBroadcastWHIPState_connected = 1,
    /// Failed, closed, or the pipeline posted an error: the session is lost.
    CBroadcastWHIPState_failed = 2,
};

/// A send-only peer: H.264 (`profile_level_id`, six hex digits; NULL: no video) and Opus at
/// 48 kHz (`audio_channels` 1 or 2; 0: no audio). `stun`: "stun://host:port" or NULL; `turns`:
/// "turn(s)://user:pass@host:port?transport=udp" URLs. NULL on failure, with `error` filled.
CBroadcastWHIPPeer *CBroadcastWHIP_new(const char *profile_level_id, int audio_channels, const char *stun,
    const char *const *turns, size_t turn_count, char *error, size_t error_size);
void CBroadcastWHIP_free(CBroadcastWHIPPeer *peer);

/// Creates the offer, sets it as the local description, waits until ICE gathering completed (at
/// most `timeout_ms`, or until `abandon` says so) and returns the local SDP with its candidates
/// (free with CBroadcastWHIP_freeString), or NULL with `error` filled.
char *CBroadcastWHIP_offer(CBroadcastWHIPPeer *peer, int64_t timeout_ms, CBroadcastAbandonCheck abandon,
    void *abandon_context, char *error, size_t error_size);
/// Sets the server's answer; 0 on success.
int CBroadcastWHIP_answer(CBroadcastWHIPPeer *peer, const char *sdp, char *error, size_t error_size);
void CBroadcastWHIP_freeString(char *text);

/// Pushes one encoded access unit (H.264 Annex B when `video`, else one Opus packet), `prefix`
/// (SPS/PPS before a keyframe, or NULL) first. Times are the encoder's, in nanoseconds; the first
/// push maps `now_ns` (the newest media time encoded) onto the pipeline's running time now, the
/// same offset for both streams (their sync in RTCP's sender reports). Never blocks: appsrc's queue
/// drops its oldest when full. 0 on success.
int CBroadcastWHIP_push(CBroadcastWHIPPeer *peer, int video, const uint8_t *data, size_t size, const uint8_t *prefix,
    size_t prefix_size, int64_t pts_ns, int64_t duration_ns, int keyframe, int64_t now_ns);

/// CBroadcastWHIPState_*; `error` gets the pipeline's error, if any.
int CBroadcastWHIP_state(CBroadcastWHIPPeer *peer, char *error, size_t error_size);
/// Keyframe requests from the viewer (PLI/FIR, as GstForceKeyUnit events reaching the video appsrc).
uint64_t CBroadcastWHIP_keyframeRequests(CBroadcastWHIPPeer *peer);
/// RTCP packets (receiver reports) received from the viewer so far; a BYE counts in `byes`.
uint64_t CBroadcastWHIP_rtcpReceived(CBroadcastWHIPPeer *peer, uint64_t *byes);

typedef struct {
    /// RTP payload bytes and packets sent (all streams).
    uint64_t bytes_sent;
    uint64_t packets_sent;
    /// From the viewer's receiver reports (0 until one came: `has_remote`).
    int has_remote;
    int64_t packets_lost;
    double fraction_lost;
    double round_trip_seconds;
    /// Changes whenever a new receiver report came for any stream (a sum over the streams of each
    /// report's extended highest sequence number and delay since the last SR); 0 until one came.
    uint64_t report_key;
} CBroadcastWHIPStats;

/// webrtcbin's get-stats, summed over the streams; 0 on success.
int CBroadcastWHIP_stats(CBroadcastWHIPPeer *peer, CBroadcastWHIPStats *stats);

typedef struct {
    /// The HTTP status; 0 when no answer came (`error` says why).
    long status;
    /// Malloc'd, or NULL: the body, the Location header resolved against the request's URL, every
    /// Link header's value (one per line), the Content-Type.
    char *body;
    char *location;
    char *links;
    char *content_type;
    char error[256];
} CBroadcastHTTPResult;

/// One request (`method` POST/DELETE/OPTIONS) with `Authorization: Bearer token` when `token` is
/// not NULL, `body` of `content_type` when not NULL, at most `timeout_ms` in all. HTTPS checks
/// the certificate (against `ca_file` when not NULL) unless `verify` is 0. `abandon` is asked
/// while the answer is awaited: non-zero ends the transfer at once. Returns 0 when an answer came
/// (any status), -1 otherwise.
int CBroadcastHTTP_request(const char *method, const char *url, const char *token, const char *content_type,
    const char *body, int64_t timeout_ms, const char *ca_file, int verify, CBroadcastAbandonCheck abandon,
    void *abandon_context, CBroadcastHTTPResult *result);
void CBroadcastHTTP_free(CBroadcastHTTPResult *result);
