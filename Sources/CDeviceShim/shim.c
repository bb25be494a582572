#include "CDeviceShim.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <libv4l2.h>
#include <linux/videodev2.h>
#include <alsa/asoundlib.h>

int CBroadcast_v4l2_open(const char *path, int flags) { return v4l2_open(path, flags); }
int CBroadcast_v4l2_close(int fd) { return v4l2_close(fd); }
int CBroadcast_v4l2_ioctl(int fd, unsigned long request, void *argument) {
    int r;
    do {
        r = v4l2_ioctl(fd, request, argument);
    } while (r == -1 && errno == EINTR);
    return r;
}

int CBroadcast_v4l2_open_checked(const char *path, int flags) {
    int fd = open(path, flags);
    if (fd < 0) return -1;
    struct v4l2_capability cap;
    int r;
    do {
        r = ioctl(fd, VIDIOC_QUERYCAP, &cap);
    } while (r == -1 && errno == EINTR);
    if (r < 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    int wrapped = v4l2_fd_open(fd, 0);
    if (wrapped < 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    return wrapped;
}

#define REQUEST(name) unsigned long CBroadcast_##name(void) { return name; }
REQUEST(VIDIOC_QUERYCAP)
REQUEST(VIDIOC_ENUM_FMT)
REQUEST(VIDIOC_G_FMT)
REQUEST(VIDIOC_S_FMT)
REQUEST(VIDIOC_TRY_FMT)
REQUEST(VIDIOC_REQBUFS)
REQUEST(VIDIOC_QUERYBUF)
REQUEST(VIDIOC_QBUF)
REQUEST(VIDIOC_DQBUF)
REQUEST(VIDIOC_STREAMON)
REQUEST(VIDIOC_STREAMOFF)
REQUEST(VIDIOC_G_PARM)
REQUEST(VIDIOC_S_PARM)
REQUEST(VIDIOC_ENUMINPUT)
REQUEST(VIDIOC_G_INPUT)
REQUEST(VIDIOC_S_INPUT)
REQUEST(VIDIOC_ENUM_FRAMESIZES)
REQUEST(VIDIOC_ENUM_FRAMEINTERVALS)
REQUEST(VIDIOC_QUERY_DV_TIMINGS)
REQUEST(VIDIOC_G_DV_TIMINGS)
REQUEST(VIDIOC_S_DV_TIMINGS)
REQUEST(VIDIOC_SUBSCRIBE_EVENT)
REQUEST(VIDIOC_DQEVENT)

static void dv_fill(const struct v4l2_dv_timings *t, CBroadcast_dv_timings *out) {
    const struct v4l2_bt_timings *bt = &t->bt;
    out->width = bt->width;
    out->height = bt->height;
    out->interlaced = bt->interlaced;
    uint64_t total = (uint64_t)V4L2_DV_BT_FRAME_WIDTH(bt) * V4L2_DV_BT_FRAME_HEIGHT(bt);
    out->millihertz = total ? (uint32_t)(bt->pixelclock * 1000 / total) : 0;
}

int CBroadcast_v4l2_query_dv_timings(int fd, CBroadcast_dv_timings *out) {
    struct v4l2_dv_timings t;
    memset(&t, 0, sizeof t);
    if (CBroadcast_v4l2_ioctl(fd, VIDIOC_QUERY_DV_TIMINGS, &t) < 0) return -1;
    dv_fill(&t, out);
    return 0;
}

int CBroadcast_v4l2_get_dv_timings(int fd, CBroadcast_dv_timings *out) {
    struct v4l2_dv_timings t;
    memset(&t, 0, sizeof t);
    if (CBroadcast_v4l2_ioctl(fd, VIDIOC_G_DV_TIMINGS, &t) < 0) return -1;
    dv_fill(&t, out);
    return 0;
}

int CBroadcast_v4l2_apply_detected_dv_timings(int fd, CBroadcast_dv_timings *out) {
    struct v4l2_dv_timings t;
    memset(&t, 0, sizeof t);
    if (CBroadcast_v4l2_ioctl(fd, VIDIOC_QUERY_DV_TIMINGS, &t) < 0) return -1;
    if (CBroadcast_v4l2_ioctl(fd, VIDIOC_S_DV_TIMINGS, &t) < 0) return -1;
    dv_fill(&t, out);
    return 0;
}

static void alsa_quiet(const char *file, int line, const char *function, int err, const char *fmt, ...) {
    (void)file; (void)line; (void)function; (void)err; (void)fmt;
}

void CBroadcast_alsa_silence_errors(void) { snd_lib_error_set_handler(alsa_quiet); }
