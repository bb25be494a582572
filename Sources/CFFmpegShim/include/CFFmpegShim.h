// What Swift cannot import from FFmpeg: function-like macros (AVERROR & co) and variadic
// functions (the av_log callback), each as a plain prefixed C function in plain C types.
#pragma once
#include <stddef.h>
#include <stdint.h>

// MARK: FFmpeg error codes and constants
/// AVERROR(errnum): FFmpeg's negative error code for a POSIX errno.
int CBroadcast_AVERROR(int errnum);
/// AVERROR_EOF
int CBroadcast_AVERROR_EOF(void);
/// AVERROR(EAGAIN)
int CBroadcast_AVERROR_EAGAIN(void);
/// AVERROR_EXIT, AVERROR_ENCODER_NOT_FOUND, AVERROR_MUXER_NOT_FOUND, AVERROR_PROTOCOL_NOT_FOUND
int CBroadcast_AVERROR_EXIT(void);
int CBroadcast_AVERROR_ENCODER_NOT_FOUND(void);
int CBroadcast_AVERROR_MUXER_NOT_FOUND(void);
int CBroadcast_AVERROR_PROTOCOL_NOT_FOUND(void);
int CBroadcast_AVERROR_HTTP_FORBIDDEN(void);
/// AVERROR_DECODER_NOT_FOUND, AVERROR_INVALIDDATA
int CBroadcast_AVERROR_DECODER_NOT_FOUND(void);
int CBroadcast_AVERROR_INVALIDDATA(void);
/// AV_NOPTS_VALUE
int64_t CBroadcast_AV_NOPTS_VALUE(void);
/// av_err2str into a caller buffer (at least 64 bytes).
void CBroadcast_av_err2str(int errnum, char *buffer, size_t size);

// MARK: FFmpeg log
/// Receives one formatted FFmpeg log line (no trailing newline) with its AV_LOG_* level.
typedef void (*CBroadcast_LogHandler)(int level, const char *line, void *context);
/// Routes av_log through `handler` (NULL restores FFmpeg's default callback).
/// Lines above `maxLevel` are dropped before formatting.
void CBroadcast_av_log_set_handler(CBroadcast_LogHandler handler, void *context, int maxLevel);

// MARK: SRT transport figures
/// What libsrt's sender knows of its path (srt_bstats), for an adaptive SRT output.
typedef struct {
    /// The sender's unacknowledged timespan: how far behind the path is, in ms (msSndBuf).
    int unacknowledged_ms;
    /// The round trip, ms.
    double rtt_ms;
    /// Data packets sent (with retransmissions), lost (reported by the receiver), and dropped by the
    /// sender as too late to send, since the connection began.
    int64_t packets_sent;
    int64_t packets_lost;
    int64_t packets_dropped;
} CBroadcast_SRTFigures;

/// The SRT socket behind an output's AVIOContext opened on srt:// by libavformat, or -1 when it is
/// not one (checked by the AVClass names of the context and its protocol's private data).
int CBroadcast_avio_srt_socket(void *avio_context);

/// The figures of `socket` (from CBroadcast_avio_srt_socket); 0 when read, -1 otherwise (no libsrt
/// in the process, a closed socket).
int CBroadcast_srt_figures(int socket, CBroadcast_SRTFigures *figures);

/// The TCP socket behind an output's AVIOContext opened on rtmp:// (RTMP over plain TCP) by
/// libavformat, or -1 when it is not one (checked by the AVClass names: the URLContext, the
/// "rtmp" protocol's private data, its stream's URLContext and the "tcp" protocol's). rtmps (TLS
/// between the two) gives -1.
int CBroadcast_avio_tcp_socket(void *avio_context);

/// The bytes `socket`'s send queue holds (written, not yet acknowledged by the peer: SIOCOUTQ), or
/// -1 when the kernel does not say.
int64_t CBroadcast_socket_queued_bytes(int socket);
