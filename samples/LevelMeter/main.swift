// Runs LevelMeterHandler on the built-in test pattern and tone for a few seconds:
//   swift run level-meter [seconds]
import BroadcastCapture
#if canImport(Glibc)
import Glibc
#endif
import BroadcastKit

let seconds = CommandLine.arguments.dropFirst().first.flatMap(Int64.init) ?? 5
let session = BroadcastSession(
    handler: LevelMeterHandler(),
    sources: [
        (.video, TestPatternSource(width: 1280, height: 720, frameRate: (30, 1))),
        (.audioMic, ToneSource()),
        (.audioApp, ToneSource(beepFrequency: 440)),
    ],
    options: SessionOptions(duration: MediaTime(value: seconds, timescale: 1))
)
do {
    let summary = try session.run(setupInfo: ["sample": "level-meter"])
    print("ended: \(summary.reason.rawValue)")
} catch {
    print("error: \(error)")
    exit(1)
}
