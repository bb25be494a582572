#include "CFFmpegShim.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <linux/sockios.h>

#include <libavutil/error.h>
#include <libavutil/log.h>
#include <libavutil/avutil.h>

int CBroadcast_AVERROR(int errnum) { return AVERROR(errnum); }
int CBroadcast_AVERROR_EOF(void) { return AVERROR_EOF; }
int CBroadcast_AVERROR_EAGAIN(void) { return AVERROR(EAGAIN); }
int CBroadcast_AVERROR_EXIT(void) { return AVERROR_EXIT; }
int CBroadcast_AVERROR_ENCODER_NOT_FOUND(void) { return AVERROR_ENCODER_NOT_FOUND; }
int CBroadcast_AVERROR_MUXER_NOT_FOUND(void) { return AVERROR_MUXER_NOT_FOUND; }
int CBroadcast_AVERROR_PROTOCOL_NOT_FOUND(void) { return AVERROR_PROTOCOL_NOT_FOUND; }
int CBroadcast_AVERROR_HTTP_FORBIDDEN(void) { return AVERROR_HTTP_FORBIDDEN; }
int CBroadcast_AVERROR_DECODER_NOT_FOUND(void) { return AVERROR_DECODER_NOT_FOUND; }
int CBroadcast_AVERROR_INVALIDDATA(void) { return AVERROR_INVALIDDATA; }
int64_t CBroadcast_AV_NOPTS_VALUE(void) { return AV_NOPTS_VALUE; }

void CBroadcast_av_err2str(int errnum, char *buffer, size_t size) {
    if (av_strerror(errnum, buffer, size) < 0) {
        snprintf(buffer, size, "unknown error %d", errnum);
    }
}

// FFmpeg calls its log callback from any thread; the handler is set once before use.
static CBroadcast_LogHandler log_handler = NULL;
static void *log_context = NULL;
static int log_max_level = AV_LOG_INFO;

static void log_trampoline(void *avcl, int level, const char *fmt, va_list vl) {
    if (level > log_max_level || log_handler == NULL) {
        return;
    }
    char line[1024];
    int print_prefix = 1;
    av_log_format_line2(avcl, level, fmt, vl, line, sizeof line, &print_prefix);
    size_t n = strlen(line);
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) {
        line[--n] = '\0';
    }
    if (n > 0) {
        log_handler(level, line, log_context);
    }
}

void CBroadcast_av_log_set_handler(CBroadcast_LogHandler handler, void *context, int maxLevel) {
    log_handler = handler;
    log_context = context;
    log_max_level = maxLevel;
    av_log_set_level(maxLevel);
    av_log_set_callback(handler ? log_trampoline : av_log_default_callback);
}

// MARK: SRT transport figures
// libavformat keeps the SRT socket in its protocol's private context; no API hands it out. Two
// private layouts are read, each checked by its AVClass name first: URLContext (av_class, prot,
// priv_data: libavformat/url.h) behind an AVIOContext that avio_open2 made (its opaque), and the
// libsrt protocol's context (class, fd: libavformat/libsrt.c); the same since FFmpeg 4.0. libsrt's
// own srt_bstats is looked up in the process (libavformat loaded it), so broadcast does not link a
// second copy of the library whose socket table would be another one.
#include <dlfcn.h>
#include <libavformat/avio.h>
#include <srt/srt.h>

struct CBroadcastURLContextPrefix {
    const AVClass *av_class;
    const void *prot;
    void *priv_data;
};

/// The private data of libavformat's libsrt and tcp protocols begins with its class and the socket.
struct CBroadcastSocketContextPrefix {
    const AVClass *class;
    int fd;
};

/// The private data of libavformat's rtmp protocol begins with its class and the URLContext of its
/// transport (FFmpeg 4 to 7: rtmpproto.c's RTMPContext).
struct CBroadcastRTMPContextPrefix {
    const AVClass *class;
    struct CBroadcastURLContextPrefix *stream;
};

/// `url`'s private data when it is a URLContext whose protocol's class is `name`, NULL otherwise.
static void *url_private(struct CBroadcastURLContextPrefix *url, const char *name) {
    if (!url || !url->av_class || !url->av_class->class_name || strcmp(url->av_class->class_name, "URLContext") != 0) return NULL;
    if (!url->priv_data) return NULL;
    const AVClass *protocol = *(const AVClass *const *)url->priv_data;
    if (!protocol || !protocol->class_name || strcmp(protocol->class_name, name) != 0) return NULL;
    return url->priv_data;
}

int CBroadcast_avio_srt_socket(void *avio_context) {
    AVIOContext *pb = avio_context;
    struct CBroadcastSocketContextPrefix *srt = pb ? url_private(pb->opaque, "libsrt") : NULL;
    return srt ? srt->fd : -1;
}

int CBroadcast_avio_tcp_socket(void *avio_context) {
    AVIOContext *pb = avio_context;
    if (!pb) return -1;
    struct CBroadcastRTMPContextPrefix *rtmp = url_private(pb->opaque, "rtmp");
    if (!rtmp) return -1;
    struct CBroadcastSocketContextPrefix *tcp = url_private(rtmp->stream, "tcp");
    return tcp ? tcp->fd : -1;
}

int64_t CBroadcast_socket_queued_bytes(int socket) {
    int queued = 0;
    if (socket < 0 || ioctl(socket, SIOCOUTQ, &queued) != 0) return -1;
    return queued;
}

typedef int (*CBroadcastSRTStats)(SRTSOCKET, SRT_TRACEBSTATS *, int);

int CBroadcast_srt_figures(int socket, CBroadcast_SRTFigures *figures) {
    static CBroadcastSRTStats stats;
    CBroadcastSRTStats fn = __atomic_load_n(&stats, __ATOMIC_ACQUIRE);
    if (!fn) {
        fn = (CBroadcastSRTStats)dlsym(RTLD_DEFAULT, "srt_bstats");
        if (!fn) return -1;
        __atomic_store_n(&stats, fn, __ATOMIC_RELEASE);
    }
    SRT_TRACEBSTATS perf;
    memset(&perf, 0, sizeof perf);
    if (fn(socket, &perf, 0) != 0) return -1;
    figures->unacknowledged_ms = perf.msSndBuf;
    figures->rtt_ms = perf.msRTT;
    figures->packets_sent = perf.pktSentTotal;
    figures->packets_lost = perf.pktSndLossTotal;
    figures->packets_dropped = perf.pktSndDropTotal;
    return 0;
}
