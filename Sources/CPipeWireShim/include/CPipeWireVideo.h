// Video through PipeWire: one pw_stream on a loop the caller iterates on its own thread (no
// pw_thread_loop), its format offer (SPA pod builders are macros), and a flat description of
// each buffer's data, crop, header, cursor and damage metadata (SPA's meta lookups are inline).
#pragma once
#include <stddef.h>
#include <stdint.h>

/// Pixel layouts broadcast accepts from PipeWire (the SPA_VIDEO_FORMAT_* values, repeated so
/// that Swift does not need SPA's enums).
enum {
    CBroadcastPWVideoFormat_unknown = 0,
    CBroadcastPWVideoFormat_BGRx,
    CBroadcastPWVideoFormat_RGBx,
    CBroadcastPWVideoFormat_BGRA,
    CBroadcastPWVideoFormat_RGBA,
    CBroadcastPWVideoFormat_xRGB,
    CBroadcastPWVideoFormat_xBGR,
    CBroadcastPWVideoFormat_ARGB,
    CBroadcastPWVideoFormat_ABGR,
    CBroadcastPWVideoFormat_YUY2,
    CBroadcastPWVideoFormat_UYVY,
};

/// Stream states as the caller needs them.
enum {
    CBroadcastPWVideoState_connecting = 0,
    CBroadcastPWVideoState_paused = 1,
    CBroadcastPWVideoState_streaming = 2,
    /// Unconnected after having connected, or an error: the node (or the portal's session) is gone.
    CBroadcastPWVideoState_lost = 3,
};

typedef struct CBroadcastPWVideo CBroadcastPWVideo;

/// One dequeued buffer, described. Valid until CBroadcastPWVideo_release.
typedef struct {
    /// Pixels of the whole buffer, chunk offset applied; NULL when the buffer carries none
    /// (a cursor-only update) or is not mappable memory.
    const uint8_t *data;
    uint32_t size;
    int32_t stride;
    /// SPA_DATA_* of the first data block (MemFd 2, MemPtr 1, DmaBuf 3).
    uint32_t dataType;
    /// The negotiated format and size.
    uint32_t format;
    uint32_t width, height;
    /// SPA_META_VideoCrop when present and valid, else the whole frame.
    int hasCrop;
    int32_t cropX, cropY;
    uint32_t cropWidth, cropHeight;
    /// spa_meta_header flags (corrupted, discont, ...) and the chunk's flags.
    uint32_t headerFlags;
    int32_t chunkFlags;
    int corrupted;
    /// spa_meta_header.pts (nanoseconds on the producer's clock) or -1.
    int64_t pts;
    /// SPA_META_Cursor: position and hotspot, and the bitmap when this buffer carries one
    /// (ARGB-family 32-bit, see bitmapFormat; a bitmap stays valid only until release: copy it).
    int hasCursor;
    int32_t cursorX, cursorY, hotX, hotY;
    int hasBitmap;
    uint32_t bitmapFormat, bitmapWidth, bitmapHeight;
    int32_t bitmapStride;
    const uint8_t *bitmapData;
    /// SPA_META_VideoDamage: the number of regions and their bounding box, over this buffer and the
    /// older ones `acquire` took and gave back unread (0 regions: not given by every one of them).
    uint32_t damageRegions;
    int32_t damageX, damageY;
    uint32_t damageWidth, damageHeight;
} CBroadcastPWVideoFrame;

/// Connects a video capture stream. `fd` >= 0: the ScreenCast portal's PipeWire remote (taken
/// over: closed with the stream); -1: the user's normal PipeWire socket. `target`: a node name or
/// serial to link to (NULL: none); `nodeID`: the portal's node id (0xffffffff: none).
/// `wantCursorMeta`: ask for SPA_META_Cursor. NULL on failure with the reason in `error`.
CBroadcastPWVideo *CBroadcastPWVideo_open(int fd, const char *target, uint32_t nodeID, int wantCursorMeta,
                                          const char *name, char *error, size_t errorSize);
/// The thread that opened the stream owns its loop (see CBroadcastPW_loopEnter) until it gives it
/// up with CBroadcastPWVideo_leave; another thread then takes it with CBroadcastPWVideo_enter
/// before calling anything else. Enter: 0 (also when this thread has it already), -1 when another
/// thread has it.
int CBroadcastPWVideo_enter(CBroadcastPWVideo *video);
void CBroadcastPWVideo_leave(CBroadcastPWVideo *video);
/// The stream's loop (for tests of who runs it).
struct pw_loop *CBroadcastPWVideo_loop(CBroadcastPWVideo *video);
/// Runs the loop once on the owning thread, waiting at most `timeoutMs` for an event. < 0 on a
/// loop error (-EBUSY: another thread owns the loop).
int CBroadcastPWVideo_iterate(CBroadcastPWVideo *video, int timeoutMs);
int CBroadcastPWVideo_state(const CBroadcastPWVideo *video);
/// Why the stream is lost (empty when it is not).
const char *CBroadcastPWVideo_error(const CBroadcastPWVideo *video);
/// Renegotiations (format changes) seen so far.
uint32_t CBroadcastPWVideo_formatChanges(const CBroadcastPWVideo *video);
/// Dequeues every queued buffer, keeps the newest, gives the others back. 1 with `frame`
/// filled, 0 when nothing new came.
int CBroadcastPWVideo_acquire(CBroadcastPWVideo *video, CBroadcastPWVideoFrame *frame);
/// Gives the held buffer back to the producer.
void CBroadcastPWVideo_release(CBroadcastPWVideo *video);
/// Destroys the stream and its connection, on the owning thread (or any thread when none owns it).
void CBroadcastPWVideo_close(CBroadcastPWVideo *video);

/// PipeWire video nodes (media.class Video/Source or Stream/Output/Video) on the normal socket.
typedef struct {
    uint32_t id;
    uint64_t serial;
    char name[128];
    char description[192];
    char mediaClass[64];
} CBroadcastPWNode;

/// Fills up to `capacity` nodes whose media.class starts with `classPrefix`; returns the count
/// (may exceed capacity), or -1 when PipeWire is not reachable.
int CBroadcastPW_listNodes(const char *classPrefix, CBroadcastPWNode *nodes, int capacity);
/// The library's and (when reachable) the server's version, for `broadcast devices`.
const char *CBroadcastPW_libraryVersion(void);
