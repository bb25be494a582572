import ArgumentParser
import Atomics
import BroadcastCapture
import BroadcastKit
import BroadcastOutputs
import BroadcastDaemon
import BroadcastService
import Logging

#if canImport(Glibc)
import Glibc
#endif

struct Record: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Record the sources to a local file.",
        discussion: """
            The container follows the file's extension:
              .mp4 .mov  fragmented while recording (a crash leaves a playable
                         file), finalized with the index in front on a clean stop
              .mkv .ts .flv
            An existing file is refused unless --overwrite (-y); it is then replaced only
            when the new recording is complete. A FIFO or /dev/null is written as a stream
            (MP4 stays fragmented).

            Examples:
              broadcast record out.mp4 --duration 10s
              broadcast record talk.mkv --size 1920x1080 --fps 30 --video-bitrate 6M
              broadcast record fast.mp4 --no-realtime --duration 1m
                  (as fast as the CPU allows)
              broadcast record talk.mp4 --output /mnt/backup/talk.mkv
                  (two files from one encode)
            broadcast record talk.mp4 --video x11::0 \\
                  --video '/dev/video0?x=75%,y=75%,width=25%,height=25%'
                  (the screen with the camera in its bottom-right corner: a further --video
                  is a layer over the first; see --video)

            While recording: Ctrl-C (SIGINT) or SIGTERM stops cleanly; a second Ctrl-C quits \
            at once (the file still plays). SIGUSR1 pauses and resumes: the file has no gap.

            Markers: each line typed while recording (standard input a terminal, a pipe or a \
            FIFO) puts a marker at that moment, titled by the line (Enter alone: "Marker 1", \
            "Marker 2", ...). MKV, MP4 and MOV recordings get them as chapters.

            With --replay 30s a replay buffer runs beside the recording: SIGUSR2 saves its last \
            30 s (plus the rest of the keyframe interval they start in) to a file of its own.
            """
    )

    @Argument(help: ArgumentHelp("The file to write: .mp4, .mov, .mkv, .ts or .flv.", valueName: "file"))
    var file: String

    @Option(name: .customLong("output"), help: ArgumentHelp("Another file written from the same encode, beside the first (a copy on another disk, an .mkv beside an .mp4); repeatable. A second quality is `stream --record` or the daemon's [[output]] keys.", valueName: "file"))
    var outputs: [String] = []

    @OptionGroup(title: "Sources") var sources: SourceOptions
    @OptionGroup(title: "Encoding") var encoding: EncoderOptions
    @OptionGroup(title: "Run") var runOptions: RunOptions
    @OptionGroup(title: "Replay buffer") var replayOptions: ReplayOptions
    @OptionGroup(title: "Memory") var memory: MemoryBudgetOptions

    func run() throws {
        // Everything the user typed is checked before anything is created: exit 2 on bad input.
        let level = try runOptions.level()
        let duration = try runOptions.mediaDuration()
        if sources.noRealtime && duration == nil {
            throw ValueError("--no-realtime needs --duration: the test sources would run as fast as possible forever")
        }
        let replay = try replayOptions.output(beside: file)
        var files = [OutputConfiguration(destination: .file(file), overwrite: runOptions.overwrite)]
        for text in outputs {
            if StreamURL.looksLikeURL(text) {
                throw ValueError("--output: record writes files; to stream and record, use broadcast stream URL --record FILE")
            }
            files.append(OutputConfiguration(destination: .file(text), overwrite: runOptions.overwrite))
        }
        try OutputConfiguration.checkDistinctFiles(files)
        let logger = Logging.bootstrap(level: level)
        let assembly = try PipelineAssembly(
            sources: try sources.settings(), encoder: try encoding.settings(),
            outputs: files + (replay.map { [$0] } ?? []),
            budget: try memory.budget(), replayLimitsSet: replayOptions.replayMaxMemory != nil ? ["replay"] : [], logger: logger)
        let budget = assembly.plan.budget
        let setupInfo = try sources.setupInfo()

        PipelineAssembly.logFFmpeg(into: logger)
        assembly.logPlan(logger)
        let handler = assembly.makeHandler(logger: logger, realtime: !sources.noRealtime)
        let session = assembly.makeSession(handler: handler, options: SessionOptions(duration: duration), logger: logger)
        let counters = handler.counters
        let outputs = handler.outputs
        MarkerInput.start(outputs: outputs.filter(\.takesMarks), logger: logger)
        let outcome = runWithSignals(
            session: session, logger: logger, setupInfo: setupInfo, quiet: runOptions.quiet,
            onSIGUSR2: { saveReplays(outputs, logger: logger) }
        ) {
            StatusLine.Snapshot(
                session: session.statistics(), encoding: counters.snapshot(), state: session.state,
                memory: ProcessMemory.current(), memoryBudget: budget)
        }
        switch outcome {
        case .success(let summary):
            let stats = handler.statistics()
            if !runOptions.quiet {
                let media = summary.statistics.values.map(\.mediaTimeNanoseconds).max() ?? 0
                FileStandardError.write(
                    "recorded \(([file] + self.outputs).joined(separator: ", ")): \(stats.videoFramesEncoded) video frames, "
                        + "\(StatusLine.clock(media)) of media, \(StatusLine.bytes(stats.bytesWritten))\n"
                )
            }
            if !handler.failures.isEmpty {
                for failure in handler.failures { logger.error("\(failure.message)") }
                throw ExitCode.failure
            }
        case .failure(let error):
            FileStandardError.write("broadcast: error: \(error)\n")
            throw ExitCode.failure
        }
    }
}
