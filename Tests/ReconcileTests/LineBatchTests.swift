import Reconcile
import Testing

@Suite struct LineBatchTests {
    @Test func aBatchIsItsLinesInOrderAsStringsAndAsBytes() {
        let batch: LineBatch = ["one", "", "three é"]
        #expect(batch.count == 3)
        #expect(Array(batch) == ["one", "", "three é"])
        #expect(batch[2] == "three é")
        #expect(Array(batch.utf8(at: 0)) == Array("one".utf8))
        #expect(batch.utf8(at: 1).isEmpty)
        #expect(batch.description == #"["one", "", "three é"]"#)
        #expect(LineBatch().isEmpty)
        var grown = LineBatch(["a"])
        grown.append("b")
        #expect(grown == ["a", "b"])
        #expect(grown != ["ab"])
        #expect(grown != ["a"])
    }

    @Test func equalBatchesAreEqualByTheirTextAndHashAlike() {
        let a = LineBatch(["x", "yz"])
        let b: LineBatch = ["x", "yz"]
        #expect(a == b)
        #expect(a.hashValue == b.hashValue)
        #expect(Set([a, b, ["xy", "z"]]).count == 2)
        // Invalid UTF-8 reads as repaired, and a batch of it equals (and
        // hashes as) one of the repaired text: the text is what counts.
        var raw = LineBatch()
        [UInt8]([0x61, 0xFF]).withUnsafeBytes { raw.append(utf8: $0) }
        #expect(raw[0] == "a\u{FFFD}")
        #expect(raw == ["a\u{FFFD}"])
        #expect(raw.hashValue == LineBatch(["a\u{FFFD}"]).hashValue)
        #expect(raw != ["a"])
    }

    @Test func aBatchKeptByTheProgramIsNotChangedByTheOneItWasCopiedFrom() {
        var batch: LineBatch = ["kept"]
        let kept = batch
        batch.append("later")
        #expect(kept == ["kept"])
        #expect(batch == ["kept", "later"])
        // Emptied and written again from its start, as the loop's spare
        // is: the kept copy still reads what it was given.
        batch.removeAll(keepingCapacity: true)
        batch.append("XXXX")
        #expect(kept == ["kept"])
        #expect(batch == ["XXXX"])
        let held = batch
        let alone = batch.emptyForReuse()
        #expect(!alone)
        batch.append("YYYY")
        #expect(held == ["XXXX"])
        #expect(batch == ["YYYY"])
        let aloneNow = batch.emptyForReuse()
        #expect(aloneNow)
    }

    /// A kept batch holds no more room than eight times its lines' own
    /// bytes, whatever else its reads held (line ends, skipped lines).
    @Test func aBatchCopiedToItsSizeKeepsOnlyItsLinesBytes() {
        var batch = LineBatch()
        let read = Array("a\n".utf8) + [UInt8](repeating: 122, count: 60_000) + [10]
        let start = read.withUnsafeBytes { batch.appendRead($0) }
        batch.appendLine(from: start, count: 1)
        #expect(batch.byteCount == 1)
        let copy = batch.copiedToSize()
        #expect(copy == ["a"])
        #expect(copy.capacity.bytes <= 32)
        #expect(batch.capacity.bytes >= 60_000)
    }
}
