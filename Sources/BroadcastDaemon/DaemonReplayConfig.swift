import BroadcastKit
import BroadcastOutputs
import BroadcastService

/// The [[output]] keys of replay buffers and finished-file commands:
///   replay = "30s"                 a replay buffer of 30 s instead of a recording (path names the saves)
///   max_memory = "200M"            its byte bound (default 256M)
///   on_file_finished = ["/usr/local/bin/upload", "{path}"]
///   hook_timeout = "10m"           how long one on_file_finished command may run (1s-24h)
struct ReplayKeys {
    var replay: (value: MediaTime, line: Int)?
    var maxMemory: (value: Int64, line: Int)?
    var onFileFinished: (value: [String], line: Int)?
    var hookTimeout: (value: MediaTime, line: Int)?
}

extension DaemonConfiguration {
    func readReplayKey(_ key: String, _ entry: TOMLDocument.Entry, into keys: inout ReplayKeys, environment: [String: String]) throws {
        let dotted = "output.\(key)"
        switch key {
        case "replay":
            let length = try duration(entry, key: dotted, environment: environment)
            guard let ns = length.nanoseconds, ns <= 86_400_000_000_000 else {
                throw error(entry.line, dotted, "at most 24h")
            }
            keys.replay = (length, entry.line)
        case "max_memory":
            let text = try scalarText(entry, key: dotted, environment: environment)
            guard let bytes = try? Values.replayMaxMemory(text, option: dotted) else {
                throw error(entry.line, dotted, "expected a size from 1M to 1T, such as \"200M\" or \"1G\", got \(text)")
            }
            keys.maxMemory = (bytes, entry.line)
        case "hook_timeout":
            let limit = try duration(entry, key: dotted, environment: environment)
            guard let ns = limit.nanoseconds, ns >= 1_000_000_000, ns <= 86_400_000_000_000 else {
                throw error(entry.line, dotted, "between 1s and 24h")
            }
            keys.hookTimeout = (limit, entry.line)
        default:  // on_file_finished
            guard case .array(let items) = entry.value, !items.isEmpty else {
                throw error(entry.line, dotted, "expected an argument vector such as [\"/usr/local/bin/upload\", \"{path}\"], got \(entry.value.typeName)")
            }
            var argv: [String] = []
            for item in items {
                guard case .string(let text) = item, !text.isEmpty || !argv.isEmpty else {
                    throw error(entry.line, dotted, "every element must be a string in quotes (the program not empty), got \(item.typeName)")
                }
                guard case .string(let text) = item else { continue }
                argv.append(text)
            }
            guard argv[0].hasPrefix("/") || !argv[0].contains("/") else {
                throw error(entry.line, dotted, "the program must be an absolute path or a name looked up in PATH, got \"\(argv[0])\"")
            }
            keys.onFileFinished = (argv, entry.line)
        }
    }

    func applyReplayKeys(_ keys: ReplayKeys, to output: inout Output) throws {
        if case .live = output.kind {
            if let replay = keys.replay { throw error(replay.line, "output.replay", "a replay buffer needs path (where saves go), not url") }
            if let hook = keys.onFileFinished { throw error(hook.line, "output.on_file_finished", "applies to outputs that write files (path), not to \"\(output.name)\"") }
        }
        if let timeout = keys.hookTimeout, keys.onFileFinished == nil {
            throw error(timeout.line, "output.hook_timeout", "applies to on_file_finished: add the command")
        }
        if let memory = keys.maxMemory, keys.replay == nil {
            throw error(memory.line, "output.max_memory", "applies to replay buffers: add replay = \"30s\"")
        }
        if let replay = keys.replay {
            if output.segment != nil || output.retainFor != nil || output.retainBytes != nil {
                throw error(replay.line, "output.replay", "a replay buffer has no segment or retain_*")
            }
            if case .recording(let template) = output.kind {
                do {
                    _ = try Recording.container(for: template)
                } catch {
                    throw self.error(replay.line, "output.path", error.message)
                }
            }
        }
        output.replay = keys.replay?.value
        output.maxMemory = keys.maxMemory?.value
        output.onFileFinished = keys.onFileFinished?.value
        output.hookTimeout = keys.hookTimeout?.value.nanoseconds.map { .nanoseconds($0) } ?? FileFinishedHook.defaultTimeout
    }
}
