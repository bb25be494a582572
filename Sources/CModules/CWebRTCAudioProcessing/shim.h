// webrtc-audio-processing (libwebrtc-audio-processing-dev) is C++: Swift does not import it.
// This module brings its pkg-config flags (include path, -DWEBRTC_POSIX) and its link to
// CDenoiseShim, whose C++ source includes the real headers and offers a C API
// (CDenoiseShim.h). Nothing here on purpose.
#pragma once
