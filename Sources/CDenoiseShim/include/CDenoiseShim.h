// The microphone's noise suppression: WebRTC's AudioProcessing module (webrtc-audio-processing
// 0.3, Debian's libwebrtc-audio-processing) with its noise suppressor alone, behind plain C.
// One denoiser is used by one thread (the session's). Everything is allocated by
// CBroadcastDenoiser_new; CBroadcastDenoiser_process allocates nothing and takes no lock of ours.
#pragma once
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CBroadcastDenoiser CBroadcastDenoiser;

/// Suppression levels, WebRTC's NoiseSuppression::Level (0 low ... 3 very high).
enum {
    CBroadcastDenoiserLevel_low = 0,
    CBroadcastDenoiserLevel_moderate = 1,
    CBroadcastDenoiserLevel_high = 2,
    CBroadcastDenoiserLevel_veryHigh = 3,
};

/// A denoiser for `channels` planar float channels (1 or 2) at `sample_rate` Hz, processing
/// frames of sample_rate / 100 samples (10 ms). NULL on failure, with `error` filled.
CBroadcastDenoiser *CBroadcastDenoiser_new(int sample_rate, int channels, int level, char *error, size_t error_size);
void CBroadcastDenoiser_free(CBroadcastDenoiser *denoiser);

/// Samples per channel in one frame (10 ms).
size_t CBroadcastDenoiser_frameSize(const CBroadcastDenoiser *denoiser);

/// Denoises one frame in place: `channels[c]` points at frameSize floats in [-1, 1].
/// 0 on success, else WebRTC's error code (the frame is then left as it was).
int CBroadcastDenoiser_process(CBroadcastDenoiser *denoiser, float *const *channels);

#ifdef __cplusplus
}
#endif
