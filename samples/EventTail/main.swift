// Follows a running daemon's events through its control socket, the way a status bar applet or a
// chat bot would: a client of the control plane links BroadcastService alone (no FFmpeg, no
// capture libraries).
//   swift run event-tail [SOCKET]      (default: /run/broadcast/control.sock, as `broadcast status`)
#if canImport(Glibc)
import Glibc
#endif
import BroadcastService

let socket = CommandLine.arguments.dropFirst().first ?? "/run/broadcast/control.sock"
let client = ControlClient(socketPath: socket)
do {
    let status = try client.events { event in
        // Written at once (not through stdio's buffer), so a pipe sees each event as it comes.
        var line = "\(event.type): \(event.data)\n"
        return line.withUTF8 { write(1, $0.baseAddress, $0.count) } == line.utf8.count
    }
    if status != 200 {
        print("the daemon refused the event stream: HTTP \(status)")
        exit(1)
    }
} catch {
    print("event-tail: \(error)")
    exit(1)
}
