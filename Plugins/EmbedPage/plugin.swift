import Foundation
import PackagePlugin

/// Puts the control page's files (Sources/BroadcastDaemon/Page: HTML, CSS, JavaScript, edited as
/// what they are) into the binary at build time: `embed-files` writes them as Swift string
/// constants of `ControlPage`. One self-contained executable, nothing to install beside it (see
/// docs/DESIGN.md, "The page as files").
@main
struct EmbedPage: BuildToolPlugin {
    /// Each file and the `ControlPage` constant it becomes.
    static let files = [("index.html", "html"), ("page.css", "style"), ("page.js", "script")]

    func createBuildCommands(context: PluginContext, target: any Target) throws -> [Command] {
        let page = target.directoryURL.appending(path: "Page")
        let inputs = Self.files.map { page.appending(path: $0.0) }
        let output = context.pluginWorkDirectoryURL.appending(path: "ControlPageFiles.swift")
        return [
            .buildCommand(
                displayName: "Embedding the control page's files",
                executable: try context.tool(named: "embed-files").url,
                arguments: [output.path] + zip(Self.files, inputs).map { "\($0.0.1)=\($0.1.path)" },
                inputFiles: inputs,
                outputFiles: [output])
        ]
    }
}
