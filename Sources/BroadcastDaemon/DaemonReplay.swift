import BroadcastKit
import BroadcastOutputs
import BroadcastService
import Metrics

#if canImport(Glibc)
import Glibc
#endif

extension BroadcastController {
    /// Saves the replay buffer of output `name` (nil: the only replay output) and waits for the
    /// file: the answer holds its path. Throws when there is nothing to save or it failed.
    func saveReplay(named name: String?, seconds: Double?) throws -> ReplaySave.Outcome {
        guard let outputs = runningOutputs() else {
            throw BroadcastError(.illegalTransition, "cannot save a replay: no broadcast is running")
        }
        let replays = outputs.filter(\.isReplay)
        let output: Output
        if let name {
            guard let found = outputs.first(where: { $0.name == name }) else {
                throw BroadcastError(.invalidArgument, "no output named \(name): outputs are \(outputs.map(\.name).joined(separator: ", "))")
            }
            guard found.isReplay else {
                throw BroadcastError(.invalidArgument, "output \(name) is not a replay buffer (set replay = \"30s\" in its [[output]])")
            }
            output = found
        } else {
            guard replays.count == 1 else {
                throw BroadcastError(
                    .invalidArgument,
                    replays.isEmpty
                        ? "no replay output: add an [[output]] with replay = \"30s\" and path = \"...\""
                        : "several replay outputs (\(replays.map(\.name).joined(separator: ", "))): name one")
            }
            output = replays[0]
        }
        if let seconds, !(seconds > 0 && seconds.isFinite) {
            throw BroadcastError(.invalidArgument, "seconds must be more than zero")
        }
        guard let save = output.saveReplay(seconds: seconds) else {
            throw BroadcastError(.invalidArgument, "output \(output.name) is not a replay buffer")
        }
        // The control client waits 30 s for an answer.
        guard let outcome = save.wait(timeoutSeconds: 25) else {
            throw BroadcastError(.outputFailed, "replay \(output.name): the save is still being written (see last_saved_path in the status)")
        }
        if let error = outcome.error { throw BroadcastError(.outputFailed, error) }
        return outcome
    }

    /// What the process holds now: its resident memory and its footprint (private dirty bytes,
    /// see `ProcessMemory`, what the budget holds; not library pages).
    static func processFootprint() -> DaemonSnapshot.ProcessFootprint {
        var resident: Int64 = 0
        if let text = DaemonConfiguration.readText("/proc/self/statm") {
            let pages = text.split(separator: " ").dropFirst().first.flatMap { Int64($0) } ?? 0
            resident = pages * Int64(sysconf(Int32(_SC_PAGESIZE)))
        }
        let footprint = ProcessMemory.current()?.privateDirtyBytes ?? 0
        return .init(residentBytes: resident, privateDirtyBytes: footprint)
    }

    static func sameReplayKeys(_ a: DaemonConfiguration.Output, _ b: DaemonConfiguration.Output) -> Bool {
        a.replay == b.replay && a.maxMemory == b.maxMemory && a.onFileFinished == b.onFileFinished
    }
}

enum ReplayAPI {
    /// POST /v1/outputs/{name}/save and /v1/replay/save (the only replay output), ?seconds=N:
    /// answers 200 once the file is written, with its path.
    static func save(name: String?, request: ControlRequest, controller: BroadcastController) -> ControlResponse {
        var seconds: Double?
        if let text = request.query["seconds"] {
            // The parser `broadcast replay save --seconds` and the config use: a number of seconds
            // or a duration ("90", "1.5", "2m"), more than zero and at most 3650d, so no value
            // reaches a conversion that traps (1e10 s in nanoseconds did: exit 132).
            do {
                seconds = Double(try Values.duration(text, option: "seconds").nanoseconds ?? 0) / 1e9
            } catch {
                return .error(400, "\(error)")
            }
        }
        do {
            let outcome = try controller.saveReplay(named: name, seconds: seconds)
            var fields: [(String, JSONValue)] = [
                ("path", .string(outcome.path ?? "")),
                ("seconds", .number((outcome.seconds * 1000).rounded() / 1000)),
                ("shorter_than_asked", .bool(outcome.isShorter)),
            ]
            if outcome.isShorter { fields.append(("note", .string("less than asked for was buffered"))) }
            return .json(200, .object(fields))
        } catch let error as BroadcastError {
            switch error.code {
            case .illegalTransition: return .error(409, error.message)
            case .invalidArgument: return .error(404, error.message)
            default: return .error(500, error.message)
            }
        } catch {
            return .error(500, "\(error)")
        }
    }
}
