import ArgumentParser
import BroadcastKit
import BroadcastOutputs
import BroadcastDaemon
import BroadcastService
import Logging

struct Stream: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Stream the sources live (RTMP, RTMPS, SRT), recording at the same time if asked.",
        discussion: """
            One encode feeds every output, each on a thread of its own behind a bounded queue: \
            a slow or dead server never stalls capture, the recording or the other streams.

              rtmp://HOST[:PORT]/APP/KEY     FLV over RTMP (nginx-rtmp, YouTube, ...)
              rtmps://HOST[:PORT]/APP/KEY    FLV over RTMP in TLS
              srt://HOST:PORT[?streamid=...&passphrase=...]
                                             MPEG-TS over SRT (caller mode)

            The stream key (an RTMP URL's last element) and any password or query secret are \
            never printed: messages show rtmp://HOST/APP/****.

            rtmps:// checks the server's certificate (the system's certificate authorities, the \
            URL's host name): one that is not trusted is refused like a wrong key, saying \
            "certificate" and why. --tls-ca FILE trusts a private CA; --tls-insecure skips the \
            check, with a warning.

            When the network is slower than the encoder, a stream drops video by backlog, like \
            OBS: non-reference frames past --drop-threshold, every frame but keyframes past \
            --drop-threshold-ref; never audio or keyframes; after a drop it resumes on a \
            keyframe. A broken connection is retried with jittered exponential backoff (about \
            0.5-1.5 s at first, x1.5 each time, up to --reconnect-max-delay) and restarts on a \
            fresh keyframe with continuous timestamps. A server that refuses the stream 3 times \
            in a row (a wrong key) is given up on.

            Examples:
              broadcast stream rtmp://127.0.0.1/live/demo --record demo.mp4
              broadcast stream rtmp://a.example/live/KEY \\
                  --output srt://b.example:9000 --output copy.mkv
              broadcast stream 'srt://127.0.0.1:9000?mode=caller' --duration 1m

            While streaming: Ctrl-C (SIGINT) or SIGTERM stops cleanly (sends what is queued for \
            up to 5 s); SIGUSR1 pauses and resumes; with --replay, SIGUSR2 saves the replay \
            buffer. With --record (or a file --output), each line typed on standard input (a \
            terminal, a pipe or a FIFO) puts a marker, a chapter, into the files (see record \
            --help). Exit status 1 when an output failed or a \
            stream never went live (the recording is still complete).
            """
    )

    @Argument(help: ArgumentHelp("Where to stream: rtmp://, rtmps://, srt://, or whip+https:// (WebRTC through a WHIP endpoint).", valueName: "url"))
    var url: String

    @Option(help: ArgumentHelp("Also record to this file (.mp4, .mov, .mkv, .ts, .flv).", valueName: "file"))
    var record: String?

    @Option(name: .customLong("output"), help: ArgumentHelp("Another output, a URL or a file; repeatable.", valueName: "url-or-file"))
    var outputs: [String] = []

    @Flag(help: "Live outputs follow their network: each gets an encode of its own whose video bitrate goes down within about a second when the send backlog grows (to a little under what the path takes) and back up in steps while it stays empty, between --min-video-bitrate and --video-bitrate. A WHIP output follows what its viewer reports over RTCP instead: loss over 10 % lowers it, under 2 % lets it rise. The recording keeps its full bitrate.")
    var adaptive = false

    @Option(name: .customLong("min-video-bitrate"), help: ArgumentHelp("With --adaptive: the lowest video bitrate (default: a quarter of --video-bitrate).", valueName: "rate"))
    var minVideoBitrate: String?

    @Option(name: .customLong("record-size"), help: ArgumentHelp("The recording's own size (at most --size): any --record-* gives the recording an encode of its own, the stream keeps --size, --video-bitrate, ....", valueName: "WxH"))
    var recordSize: String?

    @Option(name: .customLong("record-video-bitrate"), help: ArgumentHelp("The recording's own video bitrate: 8M.", valueName: "rate"))
    var recordVideoBitrate: String?

    @Option(name: .customLong("record-rate-control"), help: ArgumentHelp("The recording's own rate control: cbr, vbr or crf (default for its own encode: vbr).", valueName: "mode"))
    var recordRateControl: String?

    @Option(name: .customLong("record-crf"), help: ArgumentHelp("The recording's own quality for crf, 0-51.", valueName: "n"))
    var recordCRF: String?

    @Option(name: .customLong("record-audio-bitrate"), help: ArgumentHelp("The recording's own audio bitrate: 320k (alone, the recording keeps the stream's video).", valueName: "rate"))
    var recordAudioBitrate: String?

    @Option(name: .customLong("whip-token"), help: ArgumentHelp("whip+https://: the bearer token the WHIP endpoint asks for (never printed).", valueName: "token"))
    var whipToken: String?

    @Option(name: .customLong("reconnect-attempts"), help: ArgumentHelp("Failed connection attempts in a row before a stream gives up (default: unlimited).", valueName: "n"))
    var reconnectAttempts: Int?

    @Option(name: .customLong("reconnect-max-delay"), help: ArgumentHelp("Longest wait between attempts, before jitter.", valueName: "duration"))
    var reconnectMaxDelay: String = "2.5s"

    @Option(help: ArgumentHelp("How long a connect or a write may block before the connection counts as dead.", valueName: "duration"))
    var timeout: String = "10s"

    @Option(name: .customLong("drop-threshold"), help: ArgumentHelp("Backlog past which non-reference video frames are dropped.", valueName: "duration"))
    var dropThreshold: String = "700ms"

    @Option(name: .customLong("drop-threshold-ref"), help: ArgumentHelp("Backlog past which every video frame but keyframes is dropped.", valueName: "duration"))
    var dropThresholdReference: String = "900ms"

    @Option(name: .customLong("tls-ca"), help: ArgumentHelp("rtmps://, whip+https://: trust the certificate authorities in this PEM file (a private CA) instead of the system's.", valueName: "file"))
    var tlsCA: String?

    @Flag(name: .customLong("tls-insecure"), help: "rtmps://, whip+https://: do not check the server's certificate (a warning says so): whoever answers at the address receives the stream and its key (or token).")
    var tlsInsecure = false

    @Flag(name: .customLong("whip-allow-http"), help: "whip+http:// to a host other than this machine: send the token and the session's keys in clear (refused without this).")
    var whipAllowHTTP = false

    @OptionGroup(title: "Sources") var sources: SourceOptions
    @OptionGroup(title: "Encoding") var encoding: EncoderOptions
    @OptionGroup(title: "Run") var runOptions: RunOptions
    @OptionGroup(title: "Replay buffer") var replayOptions: ReplayOptions
    @OptionGroup(title: "Memory") var memory: MemoryBudgetOptions

    func liveSettings() throws -> LiveStreamSettings {
        var live = LiveStreamSettings()
        if let n = reconnectAttempts {
            guard n > 0 else { throw ValueError("invalid --reconnect-attempts '\(n)': must be 1 or more (leave it out for unlimited)") }
            live.reconnect.maxAttempts = n
        }
        live.reconnect.maxDelay = try Values.duration(reconnectMaxDelay, option: "--reconnect-max-delay").seconds
        live.timeout = try Values.duration(timeout, option: "--timeout").seconds
        live.dropThreshold = try Values.duration(dropThreshold, option: "--drop-threshold").seconds
        live.referenceDropThreshold = try Values.duration(dropThresholdReference, option: "--drop-threshold-ref").seconds
        guard live.referenceDropThreshold >= live.dropThreshold else {
            throw ValueError("invalid --drop-threshold-ref '\(dropThresholdReference)': must be at least --drop-threshold")
        }
        if let tlsCA {
            if tlsInsecure { throw ValueError("--tls-ca and --tls-insecure contradict each other: choose one") }
            if let problem = TLSVerification.problem(withAuthorityFile: tlsCA) { throw ValueError("invalid --tls-ca '\(tlsCA)': \(problem)") }
        }
        live.tls = TLSVerification(verify: !tlsInsecure, authorityFile: tlsCA)
        live.allowPlainHTTP = whipAllowHTTP
        return live
    }

    /// The recording's own encode when a --record-* option asks for one: the encoding options with
    /// those applied. Without --record they are refused (exit 2): they would do nothing.
    func recordingEncode(over settings: EncoderSettings) throws -> OutputEncode? {
        let given: [(flag: String, key: String, text: String?)] = [
            ("--record-size", "size", recordSize), ("--record-video-bitrate", "video_bitrate", recordVideoBitrate),
            ("--record-rate-control", "rate_control", recordRateControl), ("--record-crf", "crf", recordCRF),
            ("--record-audio-bitrate", "audio_bitrate", recordAudioBitrate),
        ]
        let set = given.filter { $0.text != nil }
        guard !set.isEmpty else { return nil }
        guard record != nil else {
            throw ValueError("\(set.map(\.flag).joined(separator: ", ")) \(set.count == 1 ? "applies" : "apply") to the recording: add --record FILE")
        }
        var encode = OutputEncode(encoder: settings, asksVideo: false)
        for (flag, key, text) in set {
            do {
                try encode.set(key, text!)
            } catch {
                // The option's own message, in this flag's name.
                let plain = "--" + key.replacing("_", with: "-")
                throw ValueError(error.description.replacing(plain, with: flag, maxReplacements: 1))
            }
        }
        return encode
    }

    func run() throws {
        // Everything the user typed is checked before anything is created: exit 2 on bad input.
        let level = try runOptions.level()
        let duration = try runOptions.mediaDuration()
        if sources.noRealtime && duration == nil {
            throw ValueError("--no-realtime needs --duration: the test sources would run as fast as possible forever")
        }
        let live = try liveSettings()
        guard StreamURL.looksLikeURL(url) else {
            // Not echoed: without its scheme nothing says which part is the key.
            throw ValueError("not a stream URL (not shown: it may hold a key): expected rtmp://HOST/APP/KEY, rtmps://... or srt://HOST:PORT")
        }
        let overwrite = runOptions.overwrite
        let encoderSettings = try encoding.settings()
        let recordEncode = try recordingEncode(over: encoderSettings)
        var configured = [OutputConfiguration(destination: try OutputDestination.parse(url), live: live)]
        if let record { configured.append(OutputConfiguration(destination: .file(record), live: live, overwrite: overwrite)) }
        for text in outputs {
            configured.append(OutputConfiguration(destination: try OutputDestination.parse(text), live: live, overwrite: overwrite))
        }
        if let replay = try replayOptions.output(beside: record) { configured.append(replay) }
        // The picture is captured once, at the largest size asked: a --record-size above --size
        // makes the picture the recording's, and the stream's encode scales it down to --size.
        var sourceSettings = try sources.settings()
        var streamSize: VideoSize?
        if let recordSize = recordEncode?.size, let asked = sourceSettings.size,
            recordSize.width > asked.width || recordSize.height > asked.height
        {
            guard recordSize.width >= asked.width, recordSize.height >= asked.height else {
                throw ValueError(
                    "--record-size \(recordSize.width)x\(recordSize.height) and --size \(asked.width)x\(asked.height): one must hold the other (the picture is captured once, at the larger)")
            }
            streamSize = asked
            sourceSettings.size = recordSize
        }
        var encodes: [String: OutputEncode] = [:]
        if let record, let recordEncode { encodes[OutputDestination.file(record).description] = recordEncode }
        if minVideoBitrate != nil, !adaptive { throw ValueError("--min-video-bitrate applies to --adaptive streams: add --adaptive") }
        if adaptive {
            let minimum = try minVideoBitrate.map { try Options.minVideoBitrate.parse($0) }
            for output in configured where output.destination.isLive {
                if let problem = OutputEncode.adaptiveProblem(output.destination) { throw ValueError("--adaptive: \(problem)") }
                encodes[output.name] = OutputEncode(encoder: encoderSettings, size: streamSize, adaptive: true, minimumBitrate: minimum)
            }
        }
        if let whipToken {
            guard configured.contains(where: \.destination.isWHIP) else {
                throw ValueError("--whip-token applies to whip+https:// (whip+http://) outputs, and none is given")
            }
            for i in configured.indices { configured[i].destination = configured[i].destination.withWHIPToken(whipToken) }
        }
        if tlsCA != nil || tlsInsecure, !configured.contains(where: {
            if case .live(let u) = $0.destination { return u.scheme == .rtmps || u.scheme == .whipHTTPS }
            return false
        }) {
            throw ValueError("\(tlsCA != nil ? "--tls-ca" : "--tls-insecure") applies to rtmps:// and whip+https:// outputs, and none is given")
        }
        if whipAllowHTTP, !configured.contains(where: {
            if case .live(let u) = $0.destination { return u.scheme == .whipHTTP }
            return false
        }) {
            throw ValueError("--whip-allow-http applies to whip+http:// outputs, and none is given")
        }
        let secrets = configured.flatMap { output -> [String] in
            if case .live(let u) = output.destination { return u.secrets }
            return []
        }

        let logger = Logging.bootstrap(level: level)
        let assembly = try PipelineAssembly(
            sources: sourceSettings, encoder: encoderSettings, outputs: configured,
            encodes: encodes, encodeSize: streamSize,
            budget: try memory.budget(), replayLimitsSet: replayOptions.replayMaxMemory != nil ? ["replay"] : [], logger: logger)
        let budget = assembly.plan.budget
        let setupInfo = try sources.setupInfo()

        PipelineAssembly.logFFmpeg(into: logger, redact: { StreamURL.scrub($0, secrets: secrets) })
        assembly.logPlan(logger)
        let handler = assembly.makeHandler(logger: logger, realtime: !sources.noRealtime)
        let session = assembly.makeSession(handler: handler, options: SessionOptions(duration: duration), logger: logger)
        let counters = handler.counters
        let outputs = handler.outputs
        // A --record file (and a replay buffer) takes markers typed on standard input, as `record` does.
        MarkerInput.start(outputs: outputs.filter(\.takesMarks), logger: logger)
        let outcome = runWithSignals(
            session: session, logger: logger, setupInfo: setupInfo, quiet: runOptions.quiet,
            onSIGUSR2: { saveReplays(outputs, logger: logger) }
        ) {
            StatusLine.Snapshot(
                session: session.statistics(), encoding: counters.snapshot(), state: session.state,
                outputs: outputs.map { $0.statistics() }, memory: ProcessMemory.current(), memoryBudget: budget)
        }
        // A summary per output, also with --quiet: it is the result.
        for output in outputs {
            FileStandardError.write("broadcast: \(StatusLine.summary(output.statistics()))\n")
        }
        switch outcome {
        case .success:
            if !handler.failures.isEmpty { throw ExitCode.failure }
        case .failure(let error):
            FileStandardError.write("broadcast: error: \(StreamURL.scrub("\(error)", secrets: secrets))\n")
            throw ExitCode.failure
        }
    }
}
