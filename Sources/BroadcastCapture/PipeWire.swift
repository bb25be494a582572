// The process's one libpipewire: initialised once, before the first stream or context.
internal import CPipeWireShim

enum PipeWire {
    /// pw_init, once per process; every PipeWire source calls it before creating its loop.
    static func initialize() { CBroadcastPW_init() }

    /// A readable text for a negative PipeWire/SPA result code.
    static func describe(_ result: Int32) -> String { String(cString: CBroadcastPW_strerror(result)) }
}
