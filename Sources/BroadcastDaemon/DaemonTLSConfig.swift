import BroadcastKit
import BroadcastOutputs
import BroadcastService

/// The [[output]] keys of an rtmps:// (or whip+https://) output's certificate check:
///   tls_ca = "/etc/broadcast/ca.pem"   trust these authorities (a private CA) instead of the system's
///   tls_verify = false                 check no certificate (a warning at each start says so)
struct TLSKeys {
    var authorityFile: (value: String, line: Int)?
    var verify: (value: Bool, line: Int)?
}

extension DaemonConfiguration {
    func readTLSKey(_ key: String, _ entry: TOMLDocument.Entry, into keys: inout TLSKeys, environment: [String: String]) throws {
        let dotted = "output.\(key)"
        if key == "tls_verify" {
            guard case .boolean(let b) = entry.value else { throw error(entry.line, dotted, "expected true or false, got \(entry.value.typeName)") }
            keys.verify = (b, entry.line)
            return
        }
        let path = try string(entry, key: dotted, environment: environment)
        guard path.hasPrefix("/") else { throw error(entry.line, dotted, "expected an absolute path, got \"\(path)\"") }
        if let problem = TLSVerification.problem(withAuthorityFile: path) { throw error(entry.line, dotted, problem) }
        keys.authorityFile = (path, entry.line)
    }

    func applyTLSKeys(_ keys: TLSKeys, to output: inout Output) throws {
        var tls = false
        if case .live(let url) = output.kind, case .live(let parsed)? = try? OutputDestination.parse(url) {
            tls = parsed.scheme == .rtmps || parsed.scheme == .whipHTTPS
        }
        for (key, line) in [("tls_ca", keys.authorityFile?.line), ("tls_verify", keys.verify?.line)] {
            if let line, !tls { throw error(line, "output.\(key)", "applies to rtmps:// and whip+https:// outputs, not to \"\(output.name)\"") }
        }
        if let file = keys.authorityFile, keys.verify?.value == false {
            throw error(file.line, "output.tls_ca", "tls_ca and tls_verify = false contradict each other: choose one")
        }
        output.tls = TLSVerification(verify: keys.verify?.value ?? true, authorityFile: keys.authorityFile?.value)
    }
}
