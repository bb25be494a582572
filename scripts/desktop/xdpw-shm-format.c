/* Preloaded into xdg-desktop-portal-wlr 0.7.x by scripts/desktop-session.sh (tests only).
 *
 * Why: xdpw 0.7.0/0.7.1 (Debian 12) starts a cast only after wlr-screencopy has announced a
 * linux_dmabuf format for the frame; it checks the portal's interface version where it means the
 * screencopy version. A compositor on the pixman renderer (headless sway in the tests) offers
 * wl_shm buffers only, so every Start fails ("unable to receive a valid format from
 * wlr_screencopy"). xdpw 0.8 replaced that code.
 *
 * What: when xdpw installs its zwlr_screencopy_frame_v1 listener, we install a copy whose `buffer`
 * handler (the wl_shm announcement) also calls xdpw's `linux_dmabuf` handler with the same size
 * and the wl_shm format translated to its DRM fourcc. xdpw then looks for DMA-BUF modifiers,
 * finds none (no GPU), and offers PipeWire the shared-memory format only, which is what we test.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

struct wl_proxy;
const char *wl_proxy_get_class(struct wl_proxy *proxy);

/* Handlers of zwlr_screencopy_frame_v1, in the order of the protocol's events. */
typedef void (*shm_buffer_event)(void *data, void *frame, uint32_t shm_format, uint32_t width,
                                 uint32_t height, uint32_t stride);
typedef void (*dmabuf_event)(void *data, void *frame, uint32_t fourcc, uint32_t width, uint32_t height);
typedef void (*other_event)(void);
struct screencopy_frame_handlers {
    shm_buffer_event buffer;
    other_event flags, ready, failed, damage;
    dmabuf_event linux_dmabuf;
    other_event buffer_done;
};

static const struct screencopy_frame_handlers *xdpw_handlers;
static struct screencopy_frame_handlers patched;

static uint32_t drm_fourcc(uint32_t shm_format) {
    switch (shm_format) {
    case 0: return 0x34325241; /* WL_SHM_FORMAT_ARGB8888 = DRM AR24 */
    case 1: return 0x34325258; /* WL_SHM_FORMAT_XRGB8888 = DRM XR24 */
    default: return shm_format; /* every other wl_shm code is already a fourcc */
    }
}

static void announce_shm_as_dmabuf(void *data, void *frame, uint32_t shm_format, uint32_t width,
                                   uint32_t height, uint32_t stride) {
    xdpw_handlers->buffer(data, frame, shm_format, width, height, stride);
    if (xdpw_handlers->linux_dmabuf != NULL)
        xdpw_handlers->linux_dmabuf(data, frame, drm_fourcc(shm_format), width, height);
}

int wl_proxy_add_listener(struct wl_proxy *proxy, void (**implementation)(void), void *data) {
    static int (*next)(struct wl_proxy *, void (**)(void), void *);
    if (next == NULL) next = dlsym(RTLD_NEXT, "wl_proxy_add_listener");
    const char *interface = wl_proxy_get_class(proxy);
    if (interface != NULL && strcmp(interface, "zwlr_screencopy_frame_v1") == 0) {
        const struct screencopy_frame_handlers *handlers = (const void *)implementation;
        if (handlers != xdpw_handlers) {
            xdpw_handlers = handlers;
            patched = *handlers;
            patched.buffer = announce_shm_as_dmabuf;
        }
        implementation = (void (**)(void))&patched;
    }
    return next(proxy, implementation, data);
}
