// The frame-rate mode's parser: beside Values (BroadcastService) but here, because the mode is an
// encoder setting (BroadcastOutputs) and the control plane a client links needs no FFmpeg.
public import BroadcastOutputs
public import BroadcastService

extension Values {
    /// "cfr" or "vfr". vfr only when nothing goes to a live output (`live` false): platforms and
    /// players of live streams expect a frame every tick.
    public static func frameRateMode(_ text: String, option: String = "--frame-rate-mode", live: Bool) throws -> FrameRateMode {
        guard let mode = FrameRateMode(rawValue: text) else {
            throw ValueError("invalid \(option) '\(text)': accepted are cfr and vfr")
        }
        if mode == .vfr, live {
            throw ValueError("\(option) vfr is for files only: a live output needs a constant frame rate (cfr)")
        }
        return mode
    }
}
