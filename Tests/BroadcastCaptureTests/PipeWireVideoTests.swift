@testable import BroadcastCapture
import BroadcastKit
import CPipeWireShim
import Foundation
import Testing

/// The PipeWire video source's parts that need no desktop: `--video` parsing, the restore-token
/// file, and the copy of a buffer (stride, crop, byte order, cursor) with hand-made buffers.
@Suite struct PipeWireVideoUnitTests {
    @Test(arguments: [
        ("portal", "monitor", "embedded"), ("portal:window?cursor=hidden", "window", "hidden"),
        ("portal?cursor=metadata", "monitor", "metadata"), ("portal:monitor", "monitor", "embedded"),
    ])
    func parsesPortalSpecs(text: String, kind: String, cursor: String) throws {
        let spec = try PipeWireVideoSpec(parsing: text)
        guard case .portal(let k) = spec.target else { Issue.record("not a portal: \(spec)"); return }
        #expect((k == .window ? "window" : "monitor") == kind)
        #expect(spec.cursor.name == cursor)
    }

    @Test func parsesNodes() throws {
        #expect(try PipeWireVideoSpec(parsing: "pipewire:42").target == .node("42"))
        #expect(try PipeWireVideoSpec(parsing: "pipewire:v4l2_input.pci-0000").target == .node("v4l2_input.pci-0000"))
    }

    @Test(arguments: ["portal:desk", "portal?cursor=blink", "portal?size=2", "pipewire:", "pipewire:a b"])
    func rejectsBadSpecs(text: String) {
        #expect(throws: BroadcastError.self) { try PipeWireVideoSpec(parsing: text) }
        do {
            _ = try PipeWireVideoSpec(parsing: text)
        } catch {
            #expect(error.code == .invalidArgument && error.message.contains("'\(text)'"), "\(error)")
        }
    }

    @Test func tokenStoreRoundTripsAndCreatesItsDirectory() throws {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("broadcast-token-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: root) }
        let store = PortalTokenStore(directory: root.path + "/state/broadcast")
        #expect(store.load(.monitor) == nil)
        try store.save("abc-1", for: .monitor)
        try store.save("win-2", for: .window)
        #expect(store.load(.monitor) == "abc-1")
        #expect(store.load(.window) == "win-2")
        try store.save("abc-3", for: .monitor)
        #expect(store.load(.monitor) == "abc-3")
        let left = try FileManager.default.contentsOfDirectory(atPath: root.path + "/state/broadcast").sorted()
        #expect(left == ["portal-monitor.token", "portal-window.token"], "no temporary files left: \(left)")
    }

    /// A buffer as PipeWire would describe it: `width`x`height` pixels at `stride`, after `offset` bytes.
    static func frame(
        _ bytes: UnsafeMutableRawBufferPointer, offset: Int, format: Int32, width: Int, height: Int, stride: Int
    ) -> CBroadcastPWVideoFrame {
        var f = CBroadcastPWVideoFrame()
        f.data = UnsafePointer(bytes.baseAddress!.advanced(by: offset).assumingMemoryBound(to: UInt8.self))
        f.size = UInt32(bytes.count - offset)
        f.stride = Int32(stride)
        f.format = UInt32(format)
        f.width = UInt32(width)
        f.height = UInt32(height)
        f.pts = -1
        return f
    }

    static func pixels(_ result: PipeWireFrameConverter.Result) -> (format: VideoFormat, values: [UInt32])? {
        guard case .frame(let image, let format) = result else { return nil }
        let count = image.bytesPerRow / 4 * format.height
        let values = Array(UnsafeBufferPointer(start: image.memory.assumingMemoryBound(to: UInt32.self), count: count))
        image.release()
        return (format, values)
    }

    /// RGBx with padded rows, a chunk offset and a crop: the cropped pixels, turned into BGRx.
    @Test func honoursOffsetStrideCropAndByteOrder() throws {
        let width = 4, height = 3, stride = 24, offset = 8
        let bytes = UnsafeMutableRawBufferPointer.allocate(byteCount: offset + stride * height, alignment: 16)
        defer { bytes.deallocate() }
        bytes.initializeMemory(as: UInt8.self, repeating: 0xee)
        for y in 0..<height {
            for x in 0..<width {
                let p = offset + y * stride + x * 4
                // R, G, B, x: R = x, G = y, B = 0x80
                bytes[p] = UInt8(x); bytes[p + 1] = UInt8(y); bytes[p + 2] = 0x80; bytes[p + 3] = 0xff
            }
        }
        var f = Self.frame(bytes, offset: offset, format: Int32(CBroadcastPWVideoFormat_RGBx), width: width, height: height, stride: stride)
        f.hasCrop = 1
        f.cropX = 1; f.cropY = 1; f.cropWidth = 2; f.cropHeight = 2
        var converter = PipeWireFrameConverter(drawCursor: false)
        let out = try #require(Self.pixels(converter.convert(f)))
        #expect(out.format == VideoFormat(pixelFormat: .bgr0, width: 2, height: 2))
        // BGRx little-endian: B | G << 8 | R << 16 | x << 24
        func bgrx(_ x: UInt32, _ y: UInt32) -> UInt32 { 0x80 | (y << 8) | (x << 16) | (0xff << 24) }
        let expected: [UInt32] = [bgrx(1, 1), bgrx(2, 1), bgrx(1, 2), bgrx(2, 2)]
        #expect(out.values == expected, "\(out.values.map { String($0, radix: 16) })")
    }

    static let orders: [(Int, [UInt8])] = [
        (Int(CBroadcastPWVideoFormat_BGRx), [0x10, 0x20, 0x30, 0x40]), (Int(CBroadcastPWVideoFormat_BGRA), [0x10, 0x20, 0x30, 0x40]),
        (Int(CBroadcastPWVideoFormat_RGBA), [0x30, 0x20, 0x10, 0x40]), (Int(CBroadcastPWVideoFormat_xRGB), [0x40, 0x30, 0x20, 0x10]),
        (Int(CBroadcastPWVideoFormat_ARGB), [0x40, 0x30, 0x20, 0x10]), (Int(CBroadcastPWVideoFormat_xBGR), [0x40, 0x10, 0x20, 0x30]),
    ]

    @Test(arguments: 0..<6)
    func everyRGBOrderBecomesBGRx(index: Int) throws {
        let format = Int32(Self.orders[index].0)
        let pixel = Self.orders[index].1
        let bytes = UnsafeMutableRawBufferPointer.allocate(byteCount: 4, alignment: 4)
        defer { bytes.deallocate() }
        for i in 0..<4 { bytes[i] = pixel[i] }
        var converter = PipeWireFrameConverter(drawCursor: false)
        let out = try #require(Self.pixels(converter.convert(Self.frame(bytes, offset: 0, format: format, width: 1, height: 1, stride: 4))))
        // B 0x10, G 0x20, R 0x30 in every case.
        #expect(out.values[0] & 0x00ff_ffff == 0x30_2010, "\(String(out.values[0], radix: 16))")
    }

    @Test func refusesAChunkSmallerThanItsRows() {
        let bytes = UnsafeMutableRawBufferPointer.allocate(byteCount: 4 * 4 * 2 - 1, alignment: 4)
        defer { bytes.deallocate() }
        var converter = PipeWireFrameConverter(drawCursor: false)
        guard case .unusable = converter.convert(Self.frame(bytes, offset: 0, format: Int32(CBroadcastPWVideoFormat_BGRx), width: 4, height: 2, stride: 16)) else {
            Issue.record("a short chunk was copied")
            return
        }
    }

    /// Cursor metadata: the bitmap (RGBA, opaque) drawn at position minus hotspot.
    @Test func drawsTheCursorAtPositionMinusHotspot() throws {
        let width = 6, height = 6
        let bytes = UnsafeMutableRawBufferPointer.allocate(byteCount: width * height * 4, alignment: 16)
        defer { bytes.deallocate() }
        bytes.initializeMemory(as: UInt8.self, repeating: 0)
        let bitmap: [UInt8] = [255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255]  // 2x2 white
        var f = Self.frame(bytes, offset: 0, format: Int32(CBroadcastPWVideoFormat_BGRx), width: width, height: height, stride: width * 4)
        var converter = PipeWireFrameConverter(drawCursor: true)
        try bitmap.withUnsafeBufferPointer { bits in
            f.hasCursor = 1
            f.cursorX = 3; f.cursorY = 4; f.hotX = 1; f.hotY = 1
            f.hasBitmap = 1
            f.bitmapFormat = UInt32(CBroadcastPWVideoFormat_RGBA)
            f.bitmapWidth = 2; f.bitmapHeight = 2; f.bitmapStride = 8
            f.bitmapData = bits.baseAddress
            converter.noteCursor(f)
            let out = try #require(Self.pixels(converter.convert(f)))
            let white = (0..<out.values.count).filter { out.values[$0] & 0xffffff == 0xffffff }
            #expect(white == [3 * width + 2, 3 * width + 3, 4 * width + 2, 4 * width + 3], "\(white)")
        }
    }
}
