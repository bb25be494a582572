#pragma once
// GStreamer's webrtcbin (gstreamer1.0-plugins-bad, libnice) and appsrc. Only CWebRTCShim includes
// these headers; Swift sees the shim's plain C API, never GObject.
#define GST_USE_UNSTABLE_API
#include <gst/gst.h>
#include <gst/app/gstappsrc.h>
#include <gst/sdp/sdp.h>
#include <gst/webrtc/webrtc.h>
