#include "CFFmpegShim.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

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
