import BroadcastKit
import BroadcastService
import Foundation
import Logging
import ServiceLifecycle
import Testing

@testable import BroadcastDaemon

/// `broadcast ui` passes each request on to the daemon's socket: the daemon must see the path and
/// query the page server saw, whatever their %-escapes decoded to (issue 35 item 17). The daemon
/// here is a control server on a socket of its own whose handler answers with what it was asked.
@Suite(.serialized) struct PageServerForwardTests {
    @Test(arguments: [
        "/v1/scene/a b",
        "/v1/scene/a\r\nX-Injected: 1",
        "/v1/scene/x HTTP/1.1\r\n\r\nPOST /v1/broadcast/stop",
        "/v1/scene/a?b=c",
        "/v1/scene/%41",
        "/v1/scene/a#b",
        "/v1/scene/\u{E9}t\u{E9}",
        "/v1/outputs/rec/pause",
    ])
    func theDaemonSeesThePathThePageServerSaw(path: String) async throws {
        let socket = FileManager.default.temporaryDirectory.appendingPathComponent("fwd-\(UUID().uuidString.prefix(8)).sock").path
        let daemon = try ControlServer(socketPath: socket, logger: Logger(label: "test")) { request in
            let query = request.query.sorted { $0.key < $1.key }.map { JSONValue.array([.string($0.key), .string($0.value)]) }
            return .json(200, .object([("method", .string(request.method)), ("path", .string(request.path)), ("query", .array(query))]))
        }
        let group = ServiceGroup(services: [daemon], logger: Logger(label: "test"))
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { try await group.run() }
            defer { tasks.cancelAll() }
            try await daemon.waitUntilListening()
            let asked = ControlRequest(method: "POST", path: path, query: ["width": "1 2&x=y", "z": "%"])
            let answer = PageServer.forward(asked, to: ControlClient(socketPath: socket))
            await group.triggerGracefulShutdown()
            try await tasks.waitForAll()
            #expect(answer.status == 200, "\(String(decoding: answer.body, as: UTF8.self))")
            guard case .object(let fields)? = JSONValue.parse(String(decoding: answer.body, as: UTF8.self)) else {
                Issue.record("not JSON: \(String(decoding: answer.body, as: UTF8.self))")
                return
            }
            let seen = Dictionary(fields, uniquingKeysWith: { a, _ in a })
            #expect(seen["method"] == .string("POST"))
            #expect(seen["path"] == .string(path))
            #expect(seen["query"] == .array([.array([.string("width"), .string("1 2&x=y")]), .array([.string("z"), .string("%")])]))
        }
    }
}
