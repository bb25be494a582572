import ArgumentParser
import BroadcastKit

struct Scene: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Switch a running daemon's picture to another scene of its config's [scenes].",
        discussion: """
            The scene shows from the next frame on, in every output at once (one encode), with no \
            gap: the sources of every scene keep capturing while another is shown, so a camera is \
            ready when its scene comes. A `scene` event says so; /v1/status says which is shown \
            ("scene") and /metrics has broadcast_scene{scene="NAME"} 1 for it.

            In the daemon's config, each scene lists the layers drawn over [video] source, written \
            as --video's layers are; the broadcast starts in the first:
              [scenes]
              screen = []
              both = ["/dev/video0?x=75%,y=75%,width=25%,height=25%"]
              camera = ["/dev/video0?fit=fill"]
            """
    )
    @OptionGroup var control: ControlOptions
    @Argument(help: ArgumentHelp("The scene's name, as [scenes] writes it.", valueName: "name"))
    var name: String
    func run() throws { try control.call("POST", "/v1/scene/\(name.percentEncoded())") }
}
