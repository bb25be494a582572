import Foundation
import Testing

/// Debian's chromium, headless, driven through chromedriver's WebDriver HTTP API (W3C), spoken
/// with curl: no Selenium, no Python. One browser session per instance; `quit()` ends both.
final class WebDriver: @unchecked Sendable {
    struct Failure: Error, CustomStringConvertible {
        let description: String
    }

    let port: Int
    private let driver: Child
    private let profile: TemporaryDirectory
    private(set) var session = ""
    static let elementKey = "element-6066-11e4-a52e-4f735466cecf"
    static let chromium = "/usr/bin/chromium"
    static let chromedriver = "/usr/bin/chromedriver"

    init() throws {
        port = try freePort()
        profile = try TemporaryDirectory()
        driver = try Child(Self.chromedriver, ["--port=\(port)"])
        // chromedriver answers /status once it listens.
        let deadline = Date().addingTimeInterval(60)
        while Date() < deadline {
            if let status = try? call("GET", "/status"), (status["value"] as? [String: Any])?["ready"] as? Bool == true { break }
            usleep(100_000)
        }
        let capabilities: [String: Any] = [
            "capabilities": [
                "alwaysMatch": [
                    "browserName": "chrome",
                    "goog:chromeOptions": [
                        "binary": Self.chromium,
                        "args": [
                            "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1100",
                            "--user-data-dir=\(profile.path("profile"))", "--no-first-run", "--disable-background-networking",
                        ],
                    ],
                    "goog:loggingPrefs": ["browser": "ALL"],
                ] as [String: Any]
            ]
        ]
        let answer = try call("POST", "/session", capabilities)
        guard let value = answer["value"] as? [String: Any], let id = value["sessionId"] as? String else {
            throw Failure(description: "chromedriver made no session: \(answer)")
        }
        session = id
    }

    func quit() {
        if !session.isEmpty { _ = try? call("DELETE", "/session/\(session)") }
        driver.signal(SIGTERM)
        _ = driver.wait(timeout: 10)
        profile.cleanup()
    }

    /// One WebDriver command; the answer's JSON object. A WebDriver error is thrown.
    @discardableResult
    func call(_ method: String, _ path: String, _ body: [String: Any]? = nil) throws -> [String: Any] {
        var arguments = ["-s", "-X", method, "--max-time", "60", "http://127.0.0.1:\(port)\(path)"]
        if let body {
            let data = try JSONSerialization.data(withJSONObject: body)
            arguments += ["-H", "Content-Type: application/json", "--data-binary", String(decoding: data, as: UTF8.self)]
        }
        let result = try run("/usr/bin/curl", arguments, timeout: 90)
        guard result.status == 0, let object = try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as? [String: Any] else {
            throw Failure(description: "\(method) \(path): curl exit \(result.status): \(result.stdout.prefix(500)) \(result.stderr.prefix(500))")
        }
        if let value = object["value"] as? [String: Any], let error = value["error"] as? String {
            throw Failure(description: "\(method) \(path): \(error): \(value["message"] ?? "")")
        }
        return object
    }

    func navigate(_ url: String) throws { try call("POST", "/session/\(session)/url", ["url": url]) }

    /// Runs `script` (a function body: `return ...`) in the page; its result.
    func execute(_ script: String, _ arguments: [Any] = []) throws -> Any? {
        try call("POST", "/session/\(session)/execute/sync", ["script": script, "args": arguments])["value"]
    }

    /// Runs an async script: `script` calls `arguments[arguments.length - 1]` with its result.
    func executeAsync(_ script: String) throws -> Any? {
        try call("POST", "/session/\(session)/execute/async", ["script": script, "args": []])["value"]
    }

    func string(_ script: String) throws -> String? { try execute(script) as? String }

    /// Polls `script` until it returns `true` or `timeout` passes; the time it took, or nil.
    func waitFor(_ script: String, timeout: Double = 60) throws -> Double? {
        let start = Date()
        while Date().timeIntervalSince(start) < timeout {
            if try execute(script) as? Bool == true { return Date().timeIntervalSince(start) }
            usleep(20_000)
        }
        return nil
    }

    /// The current window's handle; a new tab's (not switched to).
    func windowHandle() throws -> String { try call("GET", "/session/\(session)/window")["value"] as? String ?? "" }
    func newTab() throws -> String {
        ((try call("POST", "/session/\(session)/window/new", ["type": "tab"])["value"] as? [String: Any])?["handle"] as? String) ?? ""
    }
    func switchTo(_ handle: String) throws { try call("POST", "/session/\(session)/window", ["handle": handle]) }

    func click(_ css: String) throws {
        let found = try call("POST", "/session/\(session)/element", ["using": "css selector", "value": css])
        guard let element = (found["value"] as? [String: Any])?[Self.elementKey] as? String else {
            throw Failure(description: "no element \(css)")
        }
        try call("POST", "/session/\(session)/element/\(element)/click", [:])
    }

    /// The browser's console lines since the last call (chromedriver's `goog:loggingPrefs` log).
    func consoleLog() throws -> [(level: String, message: String)] {
        let answer = try call("POST", "/session/\(session)/se/log", ["type": "browser"])
        return (answer["value"] as? [[String: Any]] ?? []).map { ($0["level"] as? String ?? "", $0["message"] as? String ?? "") }
    }

    func screenshot() throws -> Data {
        let answer = try call("GET", "/session/\(session)/screenshot")
        guard let text = answer["value"] as? String, let data = Data(base64Encoded: text) else {
            throw Failure(description: "no screenshot")
        }
        return data
    }
}
