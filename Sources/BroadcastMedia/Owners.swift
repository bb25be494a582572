package import CAVCodec
package import CAVFormat
package import CAVUtil
package import CSwResample
package import CSwScale

// Every file that touches libav* imports all five C modules: the FFmpeg headers they share are
// owned by whichever module clang happened to build first, so a C enum's constants (AV_PIX_FMT_*,
// AV_SAMPLE_FMT_*) are only found reliably with all of them imported. A file whose `package`
// declarations name libav* types (here, Scaler, MJPEGDecoder, ColourDescription: what
// BroadcastComposition uses) imports all of them `package`, for the same reason: which module
// owns AVFrame or AVPixelFormat is that accident (the compiler's "package import of ... was not
// used in package declarations" names the ones it did not pick this time).

// ~Copyable owners of libav* objects: one owner, one free, in deinit. They never leave the
// package (BroadcastComposition draws into a `Frame`); the public types hold them.

/// Owns an AVFrame.
package struct Frame: ~Copyable {
    package let pointer: UnsafeMutablePointer<AVFrame>

    package init() throws(FFmpegError) {
        guard let p = av_frame_alloc() else { throw .outOfMemory("allocating a frame") }
        pointer = p
    }

    deinit {
        var p: UnsafeMutablePointer<AVFrame>? = pointer
        av_frame_free(&p)
    }

    /// Sets `data[index]` and `linesize[index]`.
    func setPlane(_ index: Int, _ data: UnsafeMutablePointer<UInt8>?, bytesPerRow: Int32) {
        withUnsafeMutableBytes(of: &pointer.pointee.data) {
            $0.bindMemory(to: UnsafeMutablePointer<UInt8>?.self)[index] = data
        }
        withUnsafeMutableBytes(of: &pointer.pointee.linesize) { $0.bindMemory(to: Int32.self)[index] = bytesPerRow }
    }

    package func plane(_ index: Int) -> UnsafeMutablePointer<UInt8>? { Self.plane(index, of: pointer) }

    package func bytesPerRow(_ index: Int) -> Int32 { Self.bytesPerRow(index, of: pointer) }

    /// `frame`'s `data[index]`: any AVFrame's, owned here or not (a decoder's, a scaler's).
    package static func plane(_ index: Int, of frame: UnsafePointer<AVFrame>) -> UnsafeMutablePointer<UInt8>? {
        withUnsafeBytes(of: frame.pointee.data) { $0.bindMemory(to: UnsafeMutablePointer<UInt8>?.self)[index] }
    }

    /// `frame`'s `linesize[index]`.
    package static func bytesPerRow(_ index: Int, of frame: UnsafePointer<AVFrame>) -> Int32 {
        withUnsafeBytes(of: frame.pointee.linesize) { $0.bindMemory(to: Int32.self)[index] }
    }

    /// `frame`'s four planes and strides, as libswscale takes them, written into arrays the
    /// caller keeps (so a conversion makes none).
    package static func planes(
        of frame: UnsafePointer<AVFrame>, into planes: inout [UnsafePointer<UInt8>?], strides: inout [Int32]
    ) {
        for index in 0..<4 {
            planes[index] = UnsafePointer(plane(index, of: frame))
            strides[index] = bytesPerRow(index, of: frame)
        }
    }
}

/// Owns an AVPacket.
struct Packet: ~Copyable {
    let pointer: UnsafeMutablePointer<AVPacket>

    init() throws(FFmpegError) {
        guard let p = av_packet_alloc() else { throw .outOfMemory("allocating a packet") }
        pointer = p
    }

    deinit {
        var p: UnsafeMutablePointer<AVPacket>? = pointer
        av_packet_free(&p)
    }

    /// A new packet sharing this one's refcounted data (av_packet_ref: no copy of the payload).
    func reference() throws(FFmpegError) -> Packet {
        let copy = try Packet()
        try check(av_packet_ref(copy.pointer, pointer), "referencing a packet")
        return copy
    }
}

/// Owns an AVCodecContext.
struct CodecContext: ~Copyable {
    let pointer: UnsafeMutablePointer<AVCodecContext>

    init(codec: UnsafePointer<AVCodec>) throws(FFmpegError) {
        guard let p = avcodec_alloc_context3(codec) else { throw .outOfMemory("allocating a codec context") }
        pointer = p
    }

    deinit {
        var p: UnsafeMutablePointer<AVCodecContext>? = pointer
        avcodec_free_context(&p)
    }

    /// Sends `frame` (nil: end of stream) and appends every packet that is ready, per avcodec.h's
    /// contract: EAGAIN from send means packets must be received first. A packet without a
    /// duration gets `defaultDuration`.
    func encode(
        _ frame: UnsafeMutablePointer<AVFrame>?,
        into packets: inout [EncodedPacket],
        mediaType: MediaType,
        streamIndex: Int,
        timeBase: Rational,
        defaultDuration: Int64 = 0,
        _ what: String
    ) throws(FFmpegError) {
        while true {
            let result = avcodec_send_frame(pointer, frame)
            if result == FFmpegError.again {
                try receive(into: &packets, mediaType, streamIndex, timeBase, defaultDuration, what)
                continue
            }
            try check(result, what)
            break
        }
        try receive(into: &packets, mediaType, streamIndex, timeBase, defaultDuration, what)
    }

    private func receive(
        into packets: inout [EncodedPacket],
        _ mediaType: MediaType,
        _ streamIndex: Int,
        _ timeBase: Rational,
        _ defaultDuration: Int64,
        _ what: String
    ) throws(FFmpegError) {
        while true {
            let packet = try Packet()
            let result = avcodec_receive_packet(pointer, packet.pointer)
            if result == FFmpegError.again || result == FFmpegError.endOfFile { return }
            try check(result, what)
            if packet.pointer.pointee.duration == 0 { packet.pointer.pointee.duration = defaultDuration }
            packets.append(EncodedPacket(taking: packet, mediaType: mediaType, streamIndex: streamIndex, timeBase: timeBase))
        }
    }
}

/// Owns an AVDictionary of options.
struct OptionDictionary: ~Copyable {
    var pointer: OpaquePointer?

    init(_ values: [String: String]) {
        pointer = nil
        for (key, value) in values.sorted(by: { $0.key < $1.key }) {
            av_dict_set(&pointer, key, value, 0)
        }
    }

    deinit {
        var p = pointer
        av_dict_free(&p)
    }

    /// Keys libav* did not consume.
    var keys: [String] {
        var keys: [String] = []
        var entry: UnsafeMutablePointer<AVDictionaryEntry>? = nil
        while let e = av_dict_get(pointer, "", entry, AV_DICT_IGNORE_SUFFIX) {
            keys.append(String(cString: e.pointee.key))
            entry = e
        }
        return keys
    }
}

/// Owns an AVAudioFifo.
struct AudioFIFO: ~Copyable {
    let pointer: OpaquePointer

    init(format: AVSampleFormat, channels: Int32, capacity: Int32) throws(FFmpegError) {
        guard let p = av_audio_fifo_alloc(format, channels, capacity) else {
            throw .outOfMemory("allocating an audio FIFO")
        }
        pointer = p
    }

    deinit { av_audio_fifo_free(pointer) }

    var count: Int32 { av_audio_fifo_size(pointer) }
}

/// Owns a SwsContext.
struct ScaleContext: ~Copyable {
    let pointer: OpaquePointer

    init(_ pointer: OpaquePointer) { self.pointer = pointer }
    deinit { sws_freeContext(pointer) }
}

/// Owns a SwrContext.
struct ResampleContext: ~Copyable {
    var pointer: OpaquePointer?

    init(_ pointer: OpaquePointer) { self.pointer = pointer }
    deinit {
        var p = pointer
        swr_free(&p)
    }
}
