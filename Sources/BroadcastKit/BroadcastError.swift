/// Why a broadcast could not start or go on. Every message names the thing it is about.
public struct BroadcastError: Error, Sendable, Hashable, CustomStringConvertible {
    public struct Code: RawRepresentable, Sendable, Hashable, CustomStringConvertible {
        public let rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }

        /// A lifecycle call that is not allowed in the session's current state.
        public static let illegalTransition = Code(rawValue: "illegal-transition")
        /// The handler asked to end the broadcast with an error.
        public static let handlerAborted = Code(rawValue: "handler-aborted")
        /// A source could not start or failed while running.
        public static let sourceFailed = Code(rawValue: "source-failed")
        /// A setting or argument is not acceptable.
        public static let invalidArgument = Code(rawValue: "invalid-argument")
        /// Encoding, muxing or writing an output failed.
        public static let outputFailed = Code(rawValue: "output-failed")
        /// The system refused something the broadcast needs (descriptors, threads).
        public static let outOfResources = Code(rawValue: "out-of-resources")

        public var description: String { rawValue }
    }

    public var code: Code
    public var message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { message }
}
