import SystemPackage

#if canImport(Glibc)
import Glibc
#endif

/// Rewrites a fragmented MP4/MOV (what `Recording` writes while recording: `moov` with empty
/// sample tables, then `moof` + `mdat` pairs) as a regular file with its index (`moov`) at the
/// front, in memory that does not grow with the recording's length.
///
/// libavformat's remux (`ffmpeg -c copy -movflags +faststart`) keeps every sample's entry in memory
/// in the demuxer and again in the muxer, and shifts the whole file to put the index in front:
/// about 30 MB per hour of 30 fps video + AAC. Here the file is read twice instead, fragment by
/// fragment: a first pass counts what each table will hold (so every box's size, and where each
/// table and the media go, are known before anything is written), a second writes each table's
/// entries through a small buffer of its own straight to its place in the output, and the media
/// is copied fragment by fragment behind the index. What is held: one fragment's `moof` (a few KB)
/// at a time, 64 KB per table, and 32 bytes per fragment (a fragment per keyframe interval).
///
/// The presentation is exactly the fragmented file's: same samples, sizes, flags, decoding and
/// composition times (a track whose first decoding time is not zero gets an edit list that keeps
/// that start). Anything this does not understand throws `Unsupported` before the destination is
/// touched by more than its first bytes; the caller then falls back to libavformat's remux.
enum MP4Defragmenter {
    struct Unsupported: Error, CustomStringConvertible {
        let reason: String
        var description: String { reason }
    }

    /// How many complete fragments (a `moof` followed by its whole `mdat`) the fragmented file at
    /// `path` holds; nil when it cannot be read.
    static func completeFragments(in path: String) -> Int? {
        guard let input = try? File(path: path, mode: .readOnly) else { return nil }
        // Closing what was only read: a failure there loses nothing.
        defer { try? input.close() }
        var offset: Int64 = 0
        var count = 0
        var afterMoof = false
        while let box = (try? input.boxHeader(at: offset)) ?? nil, box.end <= input.size {
            if box.type == "moof" {
                afterMoof = true
            } else {
                if box.type == "mdat", afterMoof { count += 1 }
                afterMoof = false
            }
            offset = box.end
        }
        return count
    }

    /// Reads `source` (fragmented) and writes the regular file into `destination` (an existing
    /// file, truncated), or through `descriptor` (an empty file `destination` names, created by
    /// the caller; taken: closed however this ends). The destination is left unfinished when this throws.
    static func defragment(source: String, destination: String, descriptor: Int32? = nil) throws {
        let taken = descriptor.map { FileDescriptor(rawValue: $0) }
        let input: File
        do {
            input = try File(path: source, mode: .readOnly)
        } catch {
            try? taken?.close()
            throw error
        }
        // Closing what was only read: a failure there loses nothing.
        defer { try? input.close() }
        let output = try taken.map { try File(descriptor: $0, path: destination) }
            ?? File(path: destination, mode: .writeOnly, options: .truncate)
        // On the way out by an error; the way out by the end closes it below, and throws if that fails.
        var outputClosed = false
        defer { if !outputClosed { try? output.close() } }

        let (ftyp, moovBytes, fragments) = try topLevelLayout(input)
        let movie = try Movie(parsing: moovBytes)
        let counts = try countSamples(input, fragments, movie)
        let layout = try Layout(ftypSize: Int64(ftyp.count), movie: movie, counts: counts, fragments: fragments)

        // The index, each table straight to its place; then the media behind it.
        var cursor = Cursor(file: output)
        try cursor.put(ftyp)
        try writeIndex(movie, counts, layout, fragments, from: input, to: output, at: &cursor)
        try copyMedia(fragments, layout, from: input, to: output, at: &cursor)
        do { try output.fd.resize(to: cursor.offset) } catch { throw File.error("truncating \(destination)", error) }
        outputClosed = true
        do { try output.close() } catch { throw File.error("closing \(destination)", error) }
    }

    /// The top-level layout: ftyp, moov, then moof + mdat pairs (a truncated last pair is left out).
    private static func topLevelLayout(_ input: File) throws -> (ftyp: [UInt8], moov: [UInt8], fragments: [Fragment]) {
        var ftyp: [UInt8]?
        var moov: [UInt8]?
        var fragments: [Fragment] = []
        var offset: Int64 = 0
        var pendingMoof: (offset: Int64, size: Int64)?
        while let box = try input.boxHeader(at: offset), box.end <= input.size {
            switch box.type {
            case "ftyp", "moov", "moof":
                // Index boxes are small; a huge one is damage, not something to read into memory.
                guard box.size <= 64 << 20 else { throw Unsupported(reason: "a \(box.type) box of \(box.size) bytes") }
                if box.type == "ftyp" { ftyp = try input.read(at: box.offset, count: Int(box.size)) }
                if box.type == "moov" { moov = try input.read(at: box.offset, count: Int(box.size)) }
                if box.type == "moof" { pendingMoof = (box.offset, box.size) }
            case "mdat":
                if let moof = pendingMoof {
                    fragments.append(Fragment(moofOffset: moof.offset, moofSize: Int32(moof.size), mdatPayload: box.payloadOffset, mdatEnd: box.end))
                }
                pendingMoof = nil
            default: break  // free, mfra, sidx, styp, ...
            }
            offset = box.end
        }
        guard let ftyp, let moov else { throw Unsupported(reason: "no ftyp or moov box") }
        return (ftyp, moov, fragments)
    }

    /// Pass 1: each track's samples and duration, checked for what the index can say.
    private static func countSamples(_ input: File, _ fragments: [Fragment], _ movie: Movie) throws -> [UInt32: TrackCount] {
        var counts: [UInt32: TrackCount] = [:]
        for track in movie.tracks { counts[track.id] = TrackCount() }
        try forEachRun(input, fragments, movie) { trackID, run in
            guard var count = counts[trackID] else { throw Unsupported(reason: "a fragment of unknown track \(trackID)") }
            count.add(run)
            counts[trackID] = count
        }
        for track in movie.tracks {
            let count = counts[track.id]!
            guard count.samples > 0 else { throw Unsupported(reason: "track \(track.id) has no samples") }
            // 2^40 ticks is 139 days at 90 kHz: anything longer is damage (and would overflow below).
            guard count.duration < 1 << 40, (count.firstDecodeTime ?? 0) < 1 << 40 else {
                throw Unsupported(reason: "track \(track.id) lasts too long")
            }
        }
        return counts
    }

    /// The regular file's sizes, worked out before anything is written: 32-bit chunk offsets unless
    /// the file is too large for them.
    private struct Layout {
        let ftypSize: Int64
        let moovSize: Int64
        let wideOffsets: Bool
        let payloadBytes: Int64
        /// 16 for a 64-bit mdat size, else 8.
        let mdatHeader: Int64
        var payloadStart: Int64 { ftypSize + moovSize + mdatHeader }

        init(ftypSize: Int64, movie: Movie, counts: [UInt32: TrackCount], fragments: [Fragment]) throws {
            let payloadBytes = fragments.reduce(Int64(0)) { $0 + ($1.mdatEnd - $1.mdatPayload) }
            let mdatHeader: Int64 = payloadBytes + 8 > Int64(UInt32.max) ? 16 : 8
            var wide = false
            var moovSize = movie.size(counts: counts, wideOffsets: false)
            if ftypSize + moovSize + mdatHeader + payloadBytes > Int64(UInt32.max) {
                wide = true
                moovSize = movie.size(counts: counts, wideOffsets: true)
            }
            guard moovSize < Int64(UInt32.max) else { throw Unsupported(reason: "an index over 4 GB") }
            (self.ftypSize, self.moovSize, self.wideOffsets, self.payloadBytes, self.mdatHeader) = (ftypSize, moovSize, wide, payloadBytes, mdatHeader)
        }
    }

    /// Pass 2: the moov, each track's tables filled in from the fragments' runs, with chunk offsets
    /// into the mdat that `copyMedia` writes behind it.
    private static func writeIndex(
        _ movie: Movie, _ counts: [UInt32: TrackCount], _ layout: Layout, _ fragments: [Fragment],
        from input: File, to output: File, at cursor: inout Cursor
    ) throws {
        var writers: [UInt32: TrackWriter] = [:]
        try movie.write(to: &cursor, counts: counts, wideOffsets: layout.wideOffsets) { trackID, tables in
            writers[trackID] = TrackWriter(file: output, tables: tables, wideOffsets: layout.wideOffsets)
        }
        guard cursor.offset == layout.ftypSize + layout.moovSize else {
            throw Unsupported(reason: "index size mismatch (\(cursor.offset) != \(layout.ftypSize + layout.moovSize))")
        }
        var fragmentStart = layout.payloadStart
        for fragment in fragments {
            try forEachRun(input, [fragment], movie) { trackID, run in
                guard run.dataOffset >= fragment.mdatPayload, run.dataOffset + run.bytes <= fragment.mdatEnd else {
                    throw Unsupported(reason: "samples outside their fragment's mdat")
                }
                try writers[trackID]!.add(run, chunkOffset: fragmentStart + run.dataOffset - fragment.mdatPayload)
            }
            fragmentStart += fragment.mdatEnd - fragment.mdatPayload
        }
        for writer in writers.values { try writer.finish() }
    }

    /// The media: one mdat holding every fragment's payload, in order.
    private static func copyMedia(_ fragments: [Fragment], _ layout: Layout, from input: File, to output: File, at cursor: inout Cursor) throws {
        if layout.mdatHeader == 16 {
            try cursor.put(Bytes.u32(1) + Bytes.fourCC("mdat") + Bytes.u64(UInt64(layout.payloadBytes + 16)))
        } else {
            try cursor.put(Bytes.u32(UInt32(layout.payloadBytes + 8)) + Bytes.fourCC("mdat"))
        }
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        for fragment in fragments {
            var position = fragment.mdatPayload
            while position < fragment.mdatEnd {
                let n = Int(min(Int64(buffer.count), fragment.mdatEnd - position))
                try input.read(at: position, into: &buffer, count: n)
                try output.write(at: cursor.offset, buffer, count: n)
                cursor.offset += Int64(n)
                position += Int64(n)
            }
        }
    }

    /// Calls `body` for every track run of `fragments`, in file order.
    private static func forEachRun(
        _ input: File, _ fragments: [Fragment], _ movie: Movie, _ body: (UInt32, Run) throws -> Void
    ) throws {
        for fragment in fragments {
            let moof = try input.read(at: fragment.moofOffset, count: Int(fragment.moofSize))
            for traf in try children(of: moof, in: 8..<moof.count) where traf.type == "traf" {
                try parseTraf(moof, traf, moofOffset: fragment.moofOffset, movie: movie, body)
            }
        }
    }

    private static func parseTraf(
        _ data: [UInt8], _ traf: Child, moofOffset: Int64, movie: Movie, _ body: (UInt32, Run) throws -> Void
    ) throws {
        let boxes = try children(of: data, in: traf.payload)
        guard let tfhd = boxes.first(where: { $0.type == "tfhd" }) else { throw Unsupported(reason: "traf without tfhd") }
        var p = tfhd.payload.lowerBound
        let tfhdFlags = Bytes.readU32(data, p) & 0xFF_FFFF
        let tfhdLength = 8 + (tfhdFlags & 0x1 != 0 ? 8 : 0) + [0x2, 0x8, 0x10, 0x20].filter { tfhdFlags & $0 != 0 }.count * 4
        guard tfhd.payload.count >= tfhdLength else { throw Unsupported(reason: "a short tfhd") }
        let trackID = Bytes.readU32(data, p + 4)
        p += 8
        guard let trex = movie.trex[trackID] else { throw Unsupported(reason: "no trex for track \(trackID)") }
        var base: Int64 = moofOffset
        if tfhdFlags & 0x1 != 0 {
            guard let explicit = Int64(exactly: Bytes.readU64(data, p)), explicit < 1 << 56 else {
                throw Unsupported(reason: "a base offset too large")
            }
            base = explicit
            p += 8
        } else if tfhdFlags & 0x2_0000 == 0 {
            throw Unsupported(reason: "fragments without default-base-is-moof")
        }
        var descriptionIndex = trex.descriptionIndex
        if tfhdFlags & 0x2 != 0 { descriptionIndex = Bytes.readU32(data, p); p += 4 }
        guard descriptionIndex == 1 else { throw Unsupported(reason: "sample description \(descriptionIndex)") }
        var defaultDuration = trex.duration
        var defaultSize = trex.size
        var defaultFlags = trex.flags
        if tfhdFlags & 0x8 != 0 { defaultDuration = Bytes.readU32(data, p); p += 4 }
        if tfhdFlags & 0x10 != 0 { defaultSize = Bytes.readU32(data, p); p += 4 }
        if tfhdFlags & 0x20 != 0 { defaultFlags = Bytes.readU32(data, p); p += 4 }
        var decodeTime: UInt64?
        if let tfdt = boxes.first(where: { $0.type == "tfdt" }) {
            guard tfdt.payload.count >= 8 else { throw Unsupported(reason: "a short tfdt") }
            let version = data[tfdt.payload.lowerBound]
            guard version == 0 || tfdt.payload.count >= 12 else { throw Unsupported(reason: "a short tfdt") }
            decodeTime = version == 1
                ? Bytes.readU64(data, tfdt.payload.lowerBound + 4) : UInt64(Bytes.readU32(data, tfdt.payload.lowerBound + 4))
        }
        var nextData = base
        for trun in boxes where trun.type == "trun" {
            var q = trun.payload.lowerBound
            guard trun.payload.count >= 8 else { throw Unsupported(reason: "a short trun") }
            let version = data[q]
            let flags = Bytes.readU32(data, q) & 0xFF_FFFF
            let count = Int(Bytes.readU32(data, q + 4))
            // A fragment per keyframe interval holds a few hundred samples; millions is damage.
            guard count <= 1_000_000 else { throw Unsupported(reason: "a trun of \(count) samples") }
            q += 8
            guard trun.payload.upperBound - q >= (flags & 0x1 != 0 ? 4 : 0) + (flags & 0x4 != 0 ? 4 : 0) else {
                throw Unsupported(reason: "a short trun")
            }
            var dataOffset = nextData
            if flags & 0x1 != 0 { dataOffset = base + Int64(Int32(bitPattern: Bytes.readU32(data, q))); q += 4 }
            var firstFlags: UInt32?
            if flags & 0x4 != 0 { firstFlags = Bytes.readU32(data, q); q += 4 }
            let perSample = (flags & 0x100 != 0 ? 4 : 0) + (flags & 0x200 != 0 ? 4 : 0) + (flags & 0x400 != 0 ? 4 : 0)
                + (flags & 0x800 != 0 ? 4 : 0)
            guard q + perSample * count <= trun.payload.upperBound else { throw Unsupported(reason: "truncated trun") }
            let run = Run(
                data: data, entries: q, count: count, flags: flags, signedOffsets: version == 1,
                firstFlags: firstFlags, defaultDuration: defaultDuration, defaultSize: defaultSize,
                defaultFlags: defaultFlags, decodeTime: decodeTime, dataOffset: dataOffset)
            guard dataOffset >= 0, let time = decodeTime ?? 0 as UInt64?, time < 1 << 48 else {
                throw Unsupported(reason: "a data offset or decoding time out of range")
            }
            try body(trackID, run)
            nextData = dataOffset + run.bytes
            decodeTime = decodeTime.map { $0 + run.duration }
        }
    }

    // MARK: Samples

    struct Fragment {
        var moofOffset: Int64
        var moofSize: Int32
        var mdatPayload: Int64
        var mdatEnd: Int64
    }

    /// One trun: samples stored one after another from `dataOffset`.
    struct Run {
        let data: [UInt8]
        let entries: Int
        let count: Int
        let flags: UInt32
        let signedOffsets: Bool
        let firstFlags: UInt32?
        let defaultDuration: UInt32
        let defaultSize: UInt32
        let defaultFlags: UInt32
        /// The first sample's decoding time (tfdt), if the fragment says.
        let decodeTime: UInt64?
        let dataOffset: Int64

        struct Sample {
            var duration: UInt32
            var size: UInt32
            var flags: UInt32
            var compositionOffset: Int32
            var isSync: Bool { flags & 0x1_0000 == 0 }
        }

        func forEachSample(_ body: (Sample) throws -> Void) rethrows {
            var p = entries
            for i in 0..<count {
                var sample = Sample(duration: defaultDuration, size: defaultSize, flags: defaultFlags, compositionOffset: 0)
                if flags & 0x100 != 0 { sample.duration = Bytes.readU32(data, p); p += 4 }
                if flags & 0x200 != 0 { sample.size = Bytes.readU32(data, p); p += 4 }
                if flags & 0x400 != 0 {
                    sample.flags = Bytes.readU32(data, p)
                    p += 4
                } else if i == 0, let firstFlags {
                    sample.flags = firstFlags
                }
                if flags & 0x800 != 0 {
                    let raw = Bytes.readU32(data, p)
                    // Version 0 offsets are unsigned; none this large is real.
                    sample.compositionOffset = signedOffsets || raw <= UInt32(Int32.max) ? Int32(bitPattern: raw) : Int32.max
                    p += 4
                }
                try body(sample)
            }
        }

        var bytes: Int64 {
            var total: Int64 = 0
            forEachSample { total += Int64($0.size) }
            return total
        }

        var duration: UInt64 {
            var total: UInt64 = 0
            forEachSample { total += UInt64($0.duration) }
            return total
        }
    }

    /// What pass 1 learns about a track: how many entries each table gets.
    struct TrackCount {
        var samples = 0
        var duration: UInt64 = 0
        var firstDecodeTime: UInt64?
        var sttsEntries = 0
        var lastDuration: UInt32?
        var cttsEntries = 0
        var lastOffset: Int32?
        var anyOffset = false
        var negativeOffset = false
        var syncSamples = 0
        var chunks = 0
        var stscEntries = 0
        var lastChunkSamples: Int?

        mutating func add(_ run: Run) {
            guard run.count > 0 else { return }
            if firstDecodeTime == nil { firstDecodeTime = run.decodeTime ?? 0 }
            chunks += 1
            if lastChunkSamples != run.count {
                stscEntries += 1
                lastChunkSamples = run.count
            }
            run.forEachSample { sample in
                samples += 1
                duration = min(duration + UInt64(sample.duration), 1 << 60)  // damage must not trap
                if lastDuration != sample.duration {
                    sttsEntries += 1
                    lastDuration = sample.duration
                }
                if lastOffset != sample.compositionOffset {
                    cttsEntries += 1
                    lastOffset = sample.compositionOffset
                }
                if sample.compositionOffset != 0 { anyOffset = true }
                if sample.compositionOffset < 0 { negativeOffset = true }
                if sample.isSync { syncSamples += 1 }
            }
        }

        var hasSyncTable: Bool { syncSamples < samples }
    }

    /// Where each table's entries go in the output.
    struct TableOffsets {
        var stts: Int64 = 0
        var ctts: Int64?
        var stss: Int64?
        var stsc: Int64 = 0
        var stsz: Int64 = 0
        var chunkOffsets: Int64 = 0
    }

    /// Pass 2 for one track: each table's entries through a buffer of its own, run-length encoded
    /// where the table is.
    final class TrackWriter {
        private var stts: TableBuffer
        private var ctts: TableBuffer?
        private var stss: TableBuffer?
        private var stsc: TableBuffer
        private var stsz: TableBuffer
        private var chunkOffsets: TableBuffer
        private let wide: Bool
        private var sampleNumber: UInt32 = 0
        private var chunkNumber: UInt32 = 0
        private var pendingDuration: (count: UInt32, value: UInt32)?
        private var pendingOffset: (count: UInt32, value: Int32)?
        private var lastChunkSamples: UInt32?

        init(file: File, tables: TableOffsets, wideOffsets: Bool) {
            stts = TableBuffer(file: file, offset: tables.stts)
            ctts = tables.ctts.map { TableBuffer(file: file, offset: $0) }
            stss = tables.stss.map { TableBuffer(file: file, offset: $0) }
            stsc = TableBuffer(file: file, offset: tables.stsc)
            stsz = TableBuffer(file: file, offset: tables.stsz)
            chunkOffsets = TableBuffer(file: file, offset: tables.chunkOffsets)
            wide = wideOffsets
        }

        func add(_ run: Run, chunkOffset: Int64) throws {
            guard run.count > 0 else { return }
            chunkNumber += 1
            if wide { try chunkOffsets.u64(UInt64(chunkOffset)) } else { try chunkOffsets.u32(UInt32(chunkOffset)) }
            if lastChunkSamples != UInt32(run.count) {
                try stsc.u32(chunkNumber)
                try stsc.u32(UInt32(run.count))
                try stsc.u32(1)
                lastChunkSamples = UInt32(run.count)
            }
            try run.forEachSample { sample in
                sampleNumber += 1
                try stsz.u32(sample.size)
                if sample.isSync { try stss?.u32(sampleNumber) }
                if let pending = pendingDuration, pending.value == sample.duration {
                    pendingDuration = (pending.count + 1, pending.value)
                } else {
                    if let pending = pendingDuration { try stts.u32(pending.count); try stts.u32(pending.value) }
                    pendingDuration = (1, sample.duration)
                }
                if let pending = pendingOffset, pending.value == sample.compositionOffset {
                    pendingOffset = (pending.count + 1, pending.value)
                } else {
                    if let pending = pendingOffset {
                        try ctts?.u32(pending.count)
                        try ctts?.u32(UInt32(bitPattern: pending.value))
                    }
                    pendingOffset = (1, sample.compositionOffset)
                }
            }
        }

        func finish() throws {
            if let pending = pendingDuration { try stts.u32(pending.count); try stts.u32(pending.value) }
            if let pending = pendingOffset {
                try ctts?.u32(pending.count)
                try ctts?.u32(UInt32(bitPattern: pending.value))
            }
            for table in [stts, ctts, stss, stsc, stsz, chunkOffsets].compactMap({ $0 }) { try table.flush() }
        }
    }

    /// Appends big-endian numbers at a place in the output, 64 KB at a time.
    final class TableBuffer {
        private let file: File
        private var offset: Int64
        private var buffer: [UInt8] = []

        init(file: File, offset: Int64) {
            self.file = file
            self.offset = offset
            buffer.reserveCapacity(1 << 16)
        }

        func u32(_ value: UInt32) throws {
            buffer.append(UInt8(value >> 24))
            buffer.append(UInt8(value >> 16 & 0xFF))
            buffer.append(UInt8(value >> 8 & 0xFF))
            buffer.append(UInt8(value & 0xFF))
            if buffer.count >= 1 << 16 { try flush() }
        }

        func u64(_ value: UInt64) throws {
            try u32(UInt32(value >> 32))
            try u32(UInt32(value & 0xFFFF_FFFF))
        }

        func flush() throws {
            guard !buffer.isEmpty else { return }
            try file.write(at: offset, buffer, count: buffer.count)
            offset += Int64(buffer.count)
            buffer.removeAll(keepingCapacity: true)
        }
    }

    // MARK: The movie box

    struct Trex {
        var descriptionIndex: UInt32
        var duration: UInt32
        var size: UInt32
        var flags: UInt32
    }

    struct Track {
        var id: UInt32
        var mediaTimescale: UInt32
        var tkhd: [UInt8]
        var mdhd: [UInt8]
        /// mdia's children but mdhd and minf, as they were.
        var mdiaOthers: [[UInt8]]
        /// minf's children but stbl, as they were.
        var minfOthers: [[UInt8]]
        var stsd: [UInt8]
        /// trak's children but tkhd and mdia, as they were.
        var trakOthers: [[UInt8]]
    }

    struct Movie {
        var mvhd: [UInt8]
        var movieTimescale: UInt32
        var tracks: [Track] = []
        var trex: [UInt32: Trex] = [:]
        /// moov's children but mvhd, trak and mvex, as they were.
        var others: [[UInt8]] = []

        init(parsing moov: [UInt8]) throws {
            var mvhd: [UInt8]?
            var others: [[UInt8]] = []
            var trakBoxes: [Child] = []
            var trexes: [UInt32: Trex] = [:]
            for child in try children(of: moov, in: 8..<moov.count) {
                switch child.type {
                case "mvhd": mvhd = Array(moov[child.range])
                case "trak": trakBoxes.append(child)
                case "mvex":
                    for trex in try children(of: moov, in: child.payload) where trex.type == "trex" {
                        guard trex.payload.count >= 24 else { throw Unsupported(reason: "a short trex") }
                        let p = trex.payload.lowerBound + 4
                        trexes[Bytes.readU32(moov, p)] = Trex(
                            descriptionIndex: Bytes.readU32(moov, p + 4), duration: Bytes.readU32(moov, p + 8),
                            size: Bytes.readU32(moov, p + 12), flags: Bytes.readU32(moov, p + 16))
                    }
                default: others.append(Array(moov[child.range]))
                }
            }
            guard let mvhd, HeaderBox.isWhole(mvhd), HeaderBox.timescale(mvhd) > 0, HeaderBox.timescale(mvhd) <= 1 << 22 else {
                throw Unsupported(reason: "moov without a whole mvhd")
            }
            self.mvhd = mvhd
            self.others = others
            movieTimescale = HeaderBox.timescale(mvhd)
            trex = trexes
            for trak in trakBoxes { tracks.append(try Self.track(moov, trak)) }
            for track in tracks where trex[track.id] == nil { throw Unsupported(reason: "no trex for track \(track.id)") }
        }

        private static func track(_ data: [UInt8], _ trak: Child) throws -> Track {
            var tkhd: [UInt8]?
            var mdhd: [UInt8]?
            var stsd: [UInt8]?
            var trakOthers: [[UInt8]] = []
            var mdiaOthers: [[UInt8]] = []
            var minfOthers: [[UInt8]] = []
            for child in try children(of: data, in: trak.payload) {
                switch child.type {
                case "tkhd": tkhd = Array(data[child.range])
                case "edts": throw Unsupported(reason: "an edit list in the fragmented file")
                case "mdia":
                    for m in try children(of: data, in: child.payload) {
                        switch m.type {
                        case "mdhd": mdhd = Array(data[m.range])
                        case "minf":
                            for n in try children(of: data, in: m.payload) {
                                if n.type == "stbl" {
                                    for s in try children(of: data, in: n.payload) {
                                        if s.type == "stsd" {
                                            stsd = Array(data[s.range])
                                        } else if ["stts", "stsc", "stsz", "stco", "co64"].contains(s.type) {
                                            // empty_moov: these hold no entries.
                                            guard s.payload.count >= (s.type == "stsz" ? 12 : 8) else { throw Unsupported(reason: "a short \(s.type)") }
                                            let entries = Bytes.readU32(data, s.payload.lowerBound + (s.type == "stsz" ? 8 : 4))
                                            if entries != 0 { throw Unsupported(reason: "samples in the moov") }
                                        } else {
                                            throw Unsupported(reason: "\(s.type) in the fragmented file's stbl")
                                        }
                                    }
                                } else {
                                    minfOthers.append(Array(data[n.range]))
                                }
                            }
                        default: mdiaOthers.append(Array(data[m.range]))
                        }
                    }
                default: trakOthers.append(Array(data[child.range]))
                }
            }
            guard let tkhd, let mdhd, let stsd else { throw Unsupported(reason: "a track without tkhd, mdhd or stsd") }
            guard HeaderBox.isWhole(tkhd), HeaderBox.isWhole(mdhd), HeaderBox.timescale(mdhd) > 0 else {
                throw Unsupported(reason: "a damaged tkhd or mdhd")
            }
            let id = Bytes.readU32(tkhd, tkhd[8] == 1 ? 8 + 4 + 16 : 8 + 4 + 8)
            return Track(
                id: id, mediaTimescale: HeaderBox.timescale(mdhd), tkhd: tkhd, mdhd: mdhd, mdiaOthers: mdiaOthers,
                minfOthers: minfOthers, stsd: stsd, trakOthers: trakOthers)
        }

        /// The track's duration in the movie's timescale, including a leading empty edit.
        func movieDuration(_ track: Track, _ count: TrackCount) -> (start: UInt64, total: UInt64) {
            let scale = { (t: UInt64) in (t * UInt64(movieTimescale) + UInt64(track.mediaTimescale) - 1) / UInt64(track.mediaTimescale) }
            let start = scale(count.firstDecodeTime ?? 0)
            return (start, start + scale(count.duration))
        }

        func size(counts: [UInt32: TrackCount], wideOffsets: Bool) -> Int64 {
            var total: Int64 = 8 + Int64(HeaderBox.size(mvhd, duration: movieDurationTotal(counts)))
            for track in tracks { total += trakSize(track, counts[track.id]!, wideOffsets) }
            return total + others.reduce(0) { $0 + Int64($1.count) }
        }

        func movieDurationTotal(_ counts: [UInt32: TrackCount]) -> UInt64 {
            tracks.map { movieDuration($0, counts[$0.id]!).total }.max() ?? 0
        }

        struct Sizes {
            var stts, ctts, stss, stsc, stsz, chunkOffsets, stbl, minf, mdia, edts, trak: Int64
        }

        func sizes(_ track: Track, _ count: TrackCount, _ wide: Bool) -> Sizes {
            let stts = 16 + 8 * Int64(count.sttsEntries)
            let ctts = count.anyOffset ? 16 + 8 * Int64(count.cttsEntries) : 0
            let stss = count.hasSyncTable ? 16 + 4 * Int64(count.syncSamples) : 0
            let stsc = 16 + 12 * Int64(count.stscEntries)
            let stsz = 20 + 4 * Int64(count.samples)
            let chunkOffsets = 16 + (wide ? 8 : 4) * Int64(count.chunks)
            let stbl = 8 + Int64(track.stsd.count) + stts + ctts + stss + stsc + stsz + chunkOffsets
            let minf = 8 + track.minfOthers.reduce(0) { $0 + Int64($1.count) } + stbl
            let mdhdSize = Int64(HeaderBox.size(track.mdhd, duration: count.duration))
            let mdia = 8 + mdhdSize + track.mdiaOthers.reduce(0) { $0 + Int64($1.count) } + minf
            let edts: Int64 = (count.firstDecodeTime ?? 0) > 0 ? 8 + 16 + 2 * 20 : 0
            let durations = movieDuration(track, count)
            let trak = 8 + Int64(HeaderBox.size(track.tkhd, duration: durations.total)) + edts + mdia
                + track.trakOthers.reduce(0) { $0 + Int64($1.count) }
            return Sizes(
                stts: stts, ctts: ctts, stss: stss, stsc: stsc, stsz: stsz, chunkOffsets: chunkOffsets, stbl: stbl,
                minf: minf, mdia: mdia, edts: edts, trak: trak)
        }

        func trakSize(_ track: Track, _ count: TrackCount, _ wide: Bool) -> Int64 { sizes(track, count, wide).trak }

        /// Writes the moov at the cursor: every box but the tables' entries, whose places are
        /// handed to `tables` (the cursor skips them).
        func write(
            to cursor: inout Cursor, counts: [UInt32: TrackCount], wideOffsets wide: Bool,
            tables: (UInt32, TableOffsets) -> Void
        ) throws {
            try cursor.put(Bytes.box("moov", size: size(counts: counts, wideOffsets: wide)))
            try cursor.put(HeaderBox.withDuration(mvhd, movieDurationTotal(counts)))
            for track in tracks {
                let count = counts[track.id]!
                let s = sizes(track, count, wide)
                let durations = movieDuration(track, count)
                try cursor.put(Bytes.box("trak", size: s.trak))
                try cursor.put(HeaderBox.withDuration(track.tkhd, durations.total))
                if s.edts > 0 {
                    // An empty edit keeps the track's late start, then the media from its start.
                    try cursor.put(Bytes.box("edts", size: s.edts) + Bytes.box("elst", size: s.edts - 8))
                    try cursor.put(Bytes.u32(1 << 24) + Bytes.u32(2))
                    try cursor.put(Bytes.u64(durations.start) + Bytes.u64(UInt64.max) + Bytes.u32(0x1_0000))
                    try cursor.put(Bytes.u64(durations.total - durations.start) + Bytes.u64(0) + Bytes.u32(0x1_0000))
                }
                for other in track.trakOthers { try cursor.put(other) }
                try cursor.put(Bytes.box("mdia", size: s.mdia))
                try cursor.put(HeaderBox.withDuration(track.mdhd, count.duration))
                for other in track.mdiaOthers { try cursor.put(other) }
                try cursor.put(Bytes.box("minf", size: s.minf))
                for other in track.minfOthers { try cursor.put(other) }
                try cursor.put(Bytes.box("stbl", size: s.stbl))
                try cursor.put(track.stsd)
                var offsets = TableOffsets()
                try cursor.put(Bytes.box("stts", size: s.stts) + Bytes.u32(0) + Bytes.u32(UInt32(count.sttsEntries)))
                offsets.stts = cursor.skip(s.stts - 16)
                if s.ctts > 0 {
                    let version: UInt32 = count.negativeOffset ? 1 << 24 : 0
                    try cursor.put(Bytes.box("ctts", size: s.ctts) + Bytes.u32(version) + Bytes.u32(UInt32(count.cttsEntries)))
                    offsets.ctts = cursor.skip(s.ctts - 16)
                }
                if s.stss > 0 {
                    try cursor.put(Bytes.box("stss", size: s.stss) + Bytes.u32(0) + Bytes.u32(UInt32(count.syncSamples)))
                    offsets.stss = cursor.skip(s.stss - 16)
                }
                try cursor.put(Bytes.box("stsc", size: s.stsc) + Bytes.u32(0) + Bytes.u32(UInt32(count.stscEntries)))
                offsets.stsc = cursor.skip(s.stsc - 16)
                try cursor.put(Bytes.box("stsz", size: s.stsz) + Bytes.u32(0) + Bytes.u32(0) + Bytes.u32(UInt32(count.samples)))
                offsets.stsz = cursor.skip(s.stsz - 20)
                try cursor.put(Bytes.box(wide ? "co64" : "stco", size: s.chunkOffsets) + Bytes.u32(0) + Bytes.u32(UInt32(count.chunks)))
                offsets.chunkOffsets = cursor.skip(s.chunkOffsets - 16)
                tables(track.id, offsets)
            }
            for other in others { try cursor.put(other) }
        }
    }

    /// mvhd, tkhd and mdhd: full boxes whose duration is 32 bits in version 0, 64 in version 1.
    enum HeaderBox {
        static func timescale(_ box: [UInt8]) -> UInt32 {
            // mvhd/mdhd: after version+flags, creation and modification times.
            Bytes.readU32(box, box[8] == 1 ? 12 + 16 : 12 + 8)
        }

        /// Bytes between the times and the duration: mvhd/mdhd a timescale, tkhd a track ID and a reserved word.
        private static func between(_ box: [UInt8]) -> Int { box[4..<8] == [0x74, 0x6B, 0x68, 0x64] ? 8 : 4 }

        /// Offset of the duration field, its width, for the box's version.
        private static func durationField(_ box: [UInt8]) -> (offset: Int, wide: Bool) {
            let wide = box[8] == 1
            return ((wide ? 12 + 16 : 12 + 8) + between(box), wide)
        }

        /// Long enough for its version's fields up to the duration (checked before any is read).
        static func isWhole(_ box: [UInt8]) -> Bool {
            guard box.count >= 12, box[8] <= 1 else { return false }
            let (offset, wide) = durationField(box)
            return box.count >= offset + (wide ? 8 : 4)
        }

        static func size(_ box: [UInt8], duration: UInt64) -> Int {
            durationField(box).wide || duration <= UInt64(UInt32.max) ? box.count : box.count + 12
        }

        /// The box with `duration`, turned into version 1 when version 0 cannot hold it.
        static func withDuration(_ box: [UInt8], _ duration: UInt64) -> [UInt8] {
            let (offset, wide) = durationField(box)
            if wide { return Array(box[..<offset]) + Bytes.u64(duration) + Array(box[(offset + 8)...]) }
            if duration <= UInt64(UInt32.max) {
                return Array(box[..<offset]) + Bytes.u32(UInt32(duration)) + Array(box[(offset + 4)...])
            }
            // Version 1: 64-bit times and duration.
            let type = Array(box[4..<8])
            var body: [UInt8] = [1] + Array(box[9..<12])
            body += Bytes.u64(UInt64(Bytes.readU32(box, 12))) + Bytes.u64(UInt64(Bytes.readU32(box, 16)))
            body += Array(box[20..<(20 + between(box))]) + Bytes.u64(duration) + Array(box[(24 + between(box))...])
            return Bytes.u32(UInt32(8 + body.count)) + type + body
        }
    }

    // MARK: Bytes and files

    struct Child {
        var type: String
        var range: Range<Int>
        var payload: Range<Int>
    }

    /// The boxes inside `range` of `data`.
    static func children(of data: [UInt8], in range: Range<Int>) throws -> [Child] {
        var result: [Child] = []
        var p = range.lowerBound
        while p + 8 <= range.upperBound {
            var size = Int(Bytes.readU32(data, p))
            var header = 8
            if size == 1 {
                guard p + 16 <= range.upperBound else { throw Unsupported(reason: "truncated box") }
                guard let large = Int(exactly: Bytes.readU64(data, p + 8)) else { throw Unsupported(reason: "a box too large") }
                size = large
                header = 16
            } else if size == 0 {
                size = range.upperBound - p
            }
            guard size >= header, size <= range.upperBound - p else { throw Unsupported(reason: "a box overruns its parent") }
            let type = String(decoding: data[(p + 4)..<(p + 8)], as: UTF8.self)
            result.append(Child(type: type, range: p..<(p + size), payload: (p + header)..<(p + size)))
            p += size
        }
        return result
    }

    enum Bytes {
        /// 0 past the end: a damaged file must never trap (every length is also checked before use).
        static func readU32(_ d: [UInt8], _ p: Int) -> UInt32 {
            guard p >= 0, p + 4 <= d.count else { return 0 }
            return UInt32(d[p]) << 24 | UInt32(d[p + 1]) << 16 | UInt32(d[p + 2]) << 8 | UInt32(d[p + 3])
        }
        static func readU64(_ d: [UInt8], _ p: Int) -> UInt64 { UInt64(readU32(d, p)) << 32 | UInt64(readU32(d, p + 4)) }
        static func u32(_ v: UInt32) -> [UInt8] { [UInt8(v >> 24), UInt8(v >> 16 & 0xFF), UInt8(v >> 8 & 0xFF), UInt8(v & 0xFF)] }
        static func u64(_ v: UInt64) -> [UInt8] { u32(UInt32(v >> 32)) + u32(UInt32(v & 0xFFFF_FFFF)) }
        static func fourCC(_ s: String) -> [UInt8] { Array(s.utf8) }
        static func box(_ type: String, size: Int64) -> [UInt8] { u32(UInt32(size)) + fourCC(type) }
    }

    struct BoxHeader {
        var type: String
        var offset: Int64
        var size: Int64
        var headerSize: Int64
        var payloadOffset: Int64 { offset + headerSize }
        var end: Int64 { offset + size }
    }

    /// Writes at a running position; `skip` leaves room for what is written elsewhere.
    struct Cursor {
        let file: File
        var offset: Int64 = 0

        mutating func put(_ bytes: [UInt8]) throws {
            try file.write(at: offset, bytes, count: bytes.count)
            offset += Int64(bytes.count)
        }

        mutating func skip(_ count: Int64) -> Int64 {
            defer { offset += count }
            return offset
        }
    }

    final class File {
        let fd: FileDescriptor
        let size: Int64
        let path: String

        convenience init(path: String, mode: FileDescriptor.AccessMode, options: FileDescriptor.OpenOptions = []) throws {
            let fd: FileDescriptor
            do {
                fd = try FileDescriptor.open(FilePath(path), mode, options: options.union(.closeOnExec))
            } catch {
                throw File.error("opening \(path)", error)
            }
            try self.init(descriptor: fd, path: path)
        }

        /// A file already open as `fd` (taken: closed by `close()`, or here when this throws).
        init(descriptor fd: FileDescriptor, path: String) throws {
            self.fd = fd
            self.path = path
            var info = stat()
            guard fstat(fd.rawValue, &info) == 0 else {
                let error = Errno(rawValue: errno)
                try? fd.close()
                throw File.error("reading the size of \(path)", error)
            }
            size = Int64(info.st_size)
        }

        func close() throws { try fd.close() }

        static func error(_ what: String, _ error: any Error) -> Unsupported {
            Unsupported(reason: "\(what): \(error)")
        }

        func read(at offset: Int64, count: Int) throws -> [UInt8] {
            var bytes = [UInt8](repeating: 0, count: count)
            try read(at: offset, into: &bytes, count: count)
            return bytes
        }

        /// Interrupted reads are retried (swift-system's `retryOnInterrupt`); a short one goes on.
        func read(at offset: Int64, into bytes: inout [UInt8], count: Int) throws {
            var done = 0
            try bytes.withUnsafeMutableBytes { raw in
                while done < count {
                    let n: Int
                    do {
                        n = try fd.read(
                            fromAbsoluteOffset: offset + Int64(done),
                            into: UnsafeMutableRawBufferPointer(rebasing: raw[done..<count]), retryOnInterrupt: true)
                    } catch {
                        throw File.error("reading \(path)", error)
                    }
                    guard n > 0 else { throw Unsupported(reason: "\(path) ends early") }
                    done += n
                }
            }
        }

        func write(at offset: Int64, _ bytes: [UInt8], count: Int) throws {
            do {
                _ = try bytes.withUnsafeBytes {
                    try fd.writeAll(toAbsoluteOffset: offset, UnsafeRawBufferPointer(rebasing: $0[0..<count]))
                }
            } catch {
                throw File.error("writing \(path)", error)
            }
        }

        /// The box starting at `offset`, or nil at the end (or a header cut short).
        func boxHeader(at offset: Int64) throws -> BoxHeader? {
            guard offset + 8 <= size else { return nil }
            let head = try read(at: offset, count: offset + 16 <= size ? 16 : 8)
            var boxSize = Int64(Bytes.readU32(head, 0))
            var header: Int64 = 8
            if boxSize == 1 {
                guard head.count == 16 else { return nil }
                boxSize = Int64(bitPattern: Bytes.readU64(head, 8))
                header = 16
            } else if boxSize == 0 {
                boxSize = size - offset
            }
            guard boxSize >= header else { return nil }
            return BoxHeader(type: String(decoding: head[4..<8], as: UTF8.self), offset: offset, size: boxSize, headerSize: header)
        }
    }
}
