// What Swift cannot import from libv4l2, alsa-lib and the kernel headers: variadic functions,
// ioctl request numbers and packed structs, each as a plain prefixed C function in plain C types.
#pragma once
#include <stddef.h>
#include <stdint.h>

// MARK: libv4l2 (variadic in C)
int CBroadcast_v4l2_open(const char *path, int flags);
int CBroadcast_v4l2_close(int fd);
/// v4l2_ioctl, retried on EINTR; returns -1 with errno set on failure.
int CBroadcast_v4l2_ioctl(int fd, unsigned long request, void *argument);
/// Opens `path` and checks it is a V4L2 node (VIDIOC_QUERYCAP) before handing it to libv4l2, which
/// would print its own error lines for anything else. -1 with errno (ENOTTY: not V4L2) on failure.
int CBroadcast_v4l2_open_checked(const char *path, int flags);

// MARK: V4L2 ioctl request numbers
unsigned long CBroadcast_VIDIOC_QUERYCAP(void);
unsigned long CBroadcast_VIDIOC_ENUM_FMT(void);
unsigned long CBroadcast_VIDIOC_G_FMT(void);
unsigned long CBroadcast_VIDIOC_S_FMT(void);
unsigned long CBroadcast_VIDIOC_TRY_FMT(void);
unsigned long CBroadcast_VIDIOC_REQBUFS(void);
unsigned long CBroadcast_VIDIOC_QUERYBUF(void);
unsigned long CBroadcast_VIDIOC_QBUF(void);
unsigned long CBroadcast_VIDIOC_DQBUF(void);
unsigned long CBroadcast_VIDIOC_STREAMON(void);
unsigned long CBroadcast_VIDIOC_STREAMOFF(void);
unsigned long CBroadcast_VIDIOC_G_PARM(void);
unsigned long CBroadcast_VIDIOC_S_PARM(void);
unsigned long CBroadcast_VIDIOC_ENUMINPUT(void);
unsigned long CBroadcast_VIDIOC_G_INPUT(void);
unsigned long CBroadcast_VIDIOC_S_INPUT(void);
unsigned long CBroadcast_VIDIOC_ENUM_FRAMESIZES(void);
unsigned long CBroadcast_VIDIOC_ENUM_FRAMEINTERVALS(void);
unsigned long CBroadcast_VIDIOC_QUERY_DV_TIMINGS(void);
unsigned long CBroadcast_VIDIOC_G_DV_TIMINGS(void);
unsigned long CBroadcast_VIDIOC_S_DV_TIMINGS(void);
unsigned long CBroadcast_VIDIOC_SUBSCRIBE_EVENT(void);
unsigned long CBroadcast_VIDIOC_DQEVENT(void);

// MARK: V4L2 DV timings (struct v4l2_dv_timings is packed: Swift cannot import its fields)
/// The active video of a DV timing, in plain C types.
typedef struct {
    uint32_t width;
    uint32_t height;
    uint32_t interlaced;
    /// Frames per second times 1000 (0 when the pixel clock or totals are unknown).
    uint32_t millihertz;
} CBroadcast_dv_timings;
/// VIDIOC_QUERY_DV_TIMINGS: what the receiver detects on its input. -1 with errno
/// (ENOLINK: no signal, ENOLCK: unstable, ERANGE: out of range, ENODATA/ENOTTY: not a DV input).
int CBroadcast_v4l2_query_dv_timings(int fd, CBroadcast_dv_timings *out);
/// VIDIOC_G_DV_TIMINGS: the timings the input is set to.
int CBroadcast_v4l2_get_dv_timings(int fd, CBroadcast_dv_timings *out);
/// VIDIOC_QUERY_DV_TIMINGS then VIDIOC_S_DV_TIMINGS with the detected timings.
int CBroadcast_v4l2_apply_detected_dv_timings(int fd, CBroadcast_dv_timings *out);

// MARK: alsa-lib
/// Stops alsa-lib printing its own error lines ("ALSA lib pcm.c:...") to stderr: broadcast reports
/// errors itself, naming the device (snd_lib_error_set_handler takes a variadic callback).
void CBroadcast_alsa_silence_errors(void);
