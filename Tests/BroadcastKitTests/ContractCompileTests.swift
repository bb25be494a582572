import ChildProcesses
import Foundation
import Testing

/// "A sample buffer is valid only during the handler call" is held by the compiler: snippets of
/// handler code (CompileChecks/) are type-checked against the built BroadcastKit module as a
/// handler outside this package sees it. The accepted one must compile, so the rejected ones fail
/// for the reason they show and not for a broken setup.
@Suite struct ContractCompileTests {
    static let checks = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("CompileChecks")

    /// .build/<triple>/debug, where the test bundle and the modules (Modules/) are.
    static let buildDirectory: URL = {
        URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath().deletingLastPathComponent()
    }()

    func typecheck(_ snippet: String) throws -> (status: Int32, errors: String) {
        let scratch = Self.buildDirectory.deletingLastPathComponent().deletingLastPathComponent()
        // The C modules BroadcastKit's own imports bring (atomics' shims, swift-system's CSystem): a
        // handler package gets them from its resolved dependencies.
        let atomicsShims = scratch.appendingPathComponent("checkouts/swift-atomics/Sources/_AtomicsShims/include/module.modulemap")
        let systemShims = scratch.appendingPathComponent("checkouts/swift-system/Sources/CSystem/include/module.modulemap")
        let typecheck = try ChildProcess.run("/usr/bin/env", [
            "swiftc", "-typecheck", "-swift-version", "6",
            "-I", Self.buildDirectory.appendingPathComponent("Modules").path,
            "-Xcc", "-fmodule-map-file=\(atomicsShims.path)",
            "-Xcc", "-fmodule-map-file=\(systemShims.path)",
            Self.checks.appendingPathComponent(snippet).path,
        ])
        return (typecheck.status, typecheck.errors)
    }

    @Test func handlerReadingPlanesInsideTheCallCompiles() throws {
        let result = try typecheck("accepted-scoped-plane.swift")
        #expect(result.status == 0, "\(result.errors)")
    }

    @Test(arguments: [
        ("rejected-escaping-span.swift", "requires that 'RawSpan' conform to 'Escapable'"),
        ("rejected-stored-plane.swift", "'planes' is inaccessible"),
        ("rejected-stored-buffer.swift", "consuming"),
    ])
    func keepingABufferOrItsBytesDoesNotCompile(snippet: String, reason: String) throws {
        let result = try typecheck(snippet)
        #expect(result.status != 0, "\(snippet) compiled")
        #expect(result.errors.contains(reason), "\(snippet): \(result.errors)")
    }
}
