import ArgumentParser
import BroadcastOutputs
import BroadcastService

struct Mark: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Put a marker (a chapter) into a running daemon's recordings, now.",
        discussion: """
            The marker is at the media time it is taken: a chapter of that title in each MKV, \
            MP4 or MOV recording being written (in the current segment's file; in a replay save \
            whose window holds it), listed under "marks" in the status and sent as a `marker` \
            event. Without a title it is "Marker N" (N counts this broadcast's markers). A title \
            is any UTF-8 text of at most 1024 bytes. Refused (exit 1) when nothing records.

            Example:
              broadcast mark "Q&A starts"
            """
    )
    @OptionGroup var control: ControlOptions
    @Argument(help: ArgumentHelp("The marker's title (default: Marker N).", valueName: "title"))
    var title: String?

    func validate() throws {
        if let title, let problem = RecordingMark.problem(with: title) { throw ValidationError(problem) }
    }

    func run() throws {
        let body = title.map { JSONValue.object([("title", .string($0))]).serialized() } ?? ""
        let (status, answer) = try ControlClient(socketPath: control.socket).send(method: "POST", path: "/v1/marker", body: Array(body.utf8))
        let text = String(decoding: answer, as: UTF8.self)
        if status >= 400 { throw refused(text) }
        print(text, terminator: text.hasSuffix("\n") ? "" : "\n")
    }
}
