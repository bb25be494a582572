#include "CDenoiseShim.h"

#include <stdio.h>
#include <webrtc/modules/audio_processing/include/audio_processing.h>

struct CBroadcastDenoiser {
    webrtc::AudioProcessing *apm;
    webrtc::StreamConfig stream;
};

extern "C" CBroadcastDenoiser *CBroadcastDenoiser_new(int sample_rate, int channels, int level, char *error, size_t error_size) {
    if (channels < 1 || channels > 2 || sample_rate <= 0 || sample_rate % 100 != 0) {
        snprintf(error, error_size, "noise suppression takes 1 or 2 channels at a rate that is a multiple of 100 Hz, not %d at %d Hz",
            channels, sample_rate);
        return nullptr;
    }
    webrtc::AudioProcessing *apm = webrtc::AudioProcessing::Create();
    if (!apm) {
        snprintf(error, error_size, "webrtc AudioProcessing::Create failed");
        return nullptr;
    }
    webrtc::StreamConfig stream(sample_rate, channels);
    webrtc::ProcessingConfig config = {{stream, stream, stream, stream}};
    int status = apm->Initialize(config);
    if (status == 0) status = apm->noise_suppression()->set_level(static_cast<webrtc::NoiseSuppression::Level>(level));
    if (status == 0) status = apm->noise_suppression()->Enable(true);
    if (status != 0) {
        snprintf(error, error_size, "webrtc noise suppression at %d Hz, %d channels: error %d", sample_rate, channels, status);
        delete apm;
        return nullptr;
    }
    return new CBroadcastDenoiser{apm, stream};
}

extern "C" void CBroadcastDenoiser_free(CBroadcastDenoiser *denoiser) {
    if (!denoiser) return;
    delete denoiser->apm;
    delete denoiser;
}

extern "C" size_t CBroadcastDenoiser_frameSize(const CBroadcastDenoiser *denoiser) { return denoiser->stream.num_frames(); }

extern "C" int CBroadcastDenoiser_process(CBroadcastDenoiser *denoiser, float *const *channels) {
    return denoiser->apm->ProcessStream(channels, denoiser->stream, denoiser->stream, channels);
}
