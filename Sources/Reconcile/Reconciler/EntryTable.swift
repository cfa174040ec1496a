/// The active entries by identity: open addressing on the identity's cached
/// hash (no re-hashing), linear probing, backward-shift deletion.
///
/// Beside each slot, one byte: 0 when the slot is empty, else `0x80` and 7
/// bits of the hash that do not choose the slot. A lookup reads these bytes
/// (64 slots a cache line) and reads an entry only when its byte matches, so
/// a miss (every new identity) touches about no entry; 1 byte a slot, under
/// 2 bytes a running subscription at the table's load.
///
/// The slots and bytes are allocated by the table itself (not arrays), so a
/// lookup or a removal does no reference counting on storage; the table owns
/// one reference to each entry in a slot.
final class EntryTable {
    @exclusivity(unchecked) private var slots: UnsafeMutablePointer<ActiveSource?>
    @exclusivity(unchecked) private var tags: UnsafeMutablePointer<UInt8>
    @exclusivity(unchecked) private var capacity: Int
    @exclusivity(unchecked) private var mask: Int
    @exclusivity(unchecked) private(set) var count = 0

    private static let initialCapacity = 16

    init() {
        (slots, tags) = Self.allocate(Self.initialCapacity)
        capacity = Self.initialCapacity
        mask = capacity - 1
    }

    deinit { Self.deallocate(slots, tags, capacity) }

    private static func allocate(_ capacity: Int) -> (UnsafeMutablePointer<ActiveSource?>, UnsafeMutablePointer<UInt8>) {
        let slots = UnsafeMutablePointer<ActiveSource?>.allocate(capacity: capacity)
        slots.initialize(repeating: nil, count: capacity)
        let tags = UnsafeMutablePointer<UInt8>.allocate(capacity: capacity)
        tags.initialize(repeating: 0, count: capacity)
        return (slots, tags)
    }

    private static func deallocate(_ slots: UnsafeMutablePointer<ActiveSource?>, _ tags: UnsafeMutablePointer<UInt8>, _ capacity: Int) {
        slots.deinitialize(count: capacity)
        slots.deallocate()
        tags.deallocate()
    }

    @inline(__always)
    private static func tag(_ hash: Int) -> UInt8 { 0x80 | UInt8(truncatingIfNeeded: UInt(bitPattern: hash) &>> 57) }

    /// The entry in slot `i` (occupied), unretained: the slot holds it.
    @inline(__always)
    private func unretained(at i: Int) -> Unmanaged<ActiveSource> {
        UnsafeRawPointer(slots + i).load(as: Unmanaged<ActiveSource>.self)
    }

    func find(_ id: borrowing SubscriptionID) -> ActiveSource? {
        find(id.cachedHash, id.kind.type, .passUnretained(id.keyBox))?.takeUnretainedValue()
    }

    /// The entry whose identity has cached hash `hash`, kind `kind` and a
    /// key equal to the one in `key` (held by the caller), unretained.
    func find(_ hash: Int, _ kind: ObjectIdentifier, _ key: Unmanaged<HashableBox>) -> Unmanaged<ActiveSource>? {
        let t = Self.tag(hash)
        var i = hash & mask
        while true {
            let x = tags[i]
            if x == 0 { return nil }
            if x == t {
                let u = unretained(at: i)
                if u._withUnsafeGuaranteedRef({ $0.hasIdentity(hash, kind, key) }) { return u }
            }
            i = (i &+ 1) & mask
        }
    }

    func insert(_ entry: __owned ActiveSource) {
        if (count + 1) * 4 > capacity * 3 { grow() }
        count += 1
        place(entry)
    }

    private func place(_ entry: __owned ActiveSource) {
        let hash = entry.id.cachedHash
        var i = hash & mask
        while tags[i] != 0 { i = (i &+ 1) & mask }
        tags[i] = Self.tag(hash)
        slots[i] = entry
    }

    private func slot(of entry: ActiveSource) -> Int? {
        let hash = entry.id.cachedHash
        let t = Self.tag(hash)
        let target = Unmanaged.passUnretained(entry).toOpaque()
        var i = hash & mask
        while true {
            let x = tags[i]
            if x == 0 { return nil }
            if x == t, unretained(at: i).toOpaque() == target { return i }
            i = (i &+ 1) & mask
        }
    }

    func replace(_ old: ActiveSource, with new: ActiveSource) {
        guard let i = slot(of: old) else { return insert(new) }
        slots[i] = new
    }

    /// Removes `entry` and returns the table's reference to it (moved out:
    /// no reference counting).
    func take(_ entry: ActiveSource) -> ActiveSource? {
        guard var i = slot(of: entry) else { return nil }
        count -= 1
        let mask = self.mask
        var taken: ActiveSource?
        swap(&taken, &slots[i])
        tags[i] = 0
        var j = i
        while true {
            j = (j &+ 1) & mask
            guard tags[j] != 0 else { break }
            let k = unretained(at: j)._withUnsafeGuaranteedRef { $0.id.cachedHash } & mask
            // The entry at j stays if its home k lies cyclically in (i, j].
            let stays = i <= j ? (i < k && k <= j) : (i < k || k <= j)
            if stays { continue }
            swap(&slots[i], &slots[j])
            tags[i] = tags[j]
            tags[j] = 0
            i = j
        }
        return taken
    }

    private func grow() {
        let (oldSlots, oldTags, oldCapacity) = (slots, tags, capacity)
        capacity = oldCapacity * 2
        mask = capacity - 1
        (slots, tags) = Self.allocate(capacity)
        for k in 0..<oldCapacity where oldTags[k] != 0 {
            var e: ActiveSource?
            swap(&e, &oldSlots[k])
            if let e { place(e) }
        }
        Self.deallocate(oldSlots, oldTags, oldCapacity)
    }

    var all: [ActiveSource] {
        var all: [ActiveSource] = []
        all.reserveCapacity(count)
        for k in 0..<capacity { if let e = slots[k] { all.append(e) } }
        return all
    }

    /// Empties the table without releasing its entries: the caller has
    /// taken over the table's reference to every one of them.
    func abandonAll() {
        for k in 0..<capacity where tags[k] != 0 { (slots + k).initialize(to: nil) }
        tags.update(repeating: 0, count: capacity)
        count = 0
    }

    func removeAll() {
        Self.deallocate(slots, tags, capacity)
        capacity = Self.initialCapacity
        mask = capacity - 1
        (slots, tags) = Self.allocate(capacity)
        count = 0
    }
}

extension EntryTable {
    /// Traps when the table is inconsistent: the count, each slot's tag, and
    /// each entry reachable from its home slot (no hole on its probe path).
    func _checkInvariants() {
        var occupied = 0
        for i in 0..<capacity where tags[i] != 0 {
            occupied += 1
            guard let e = slots[i] else { preconditionFailure("slot \(i) is tagged but empty") }
            precondition(tags[i] == Self.tag(e.id.cachedHash), "slot \(i) has another entry's tag")
            var j = e.id.cachedHash & mask
            while j != i {
                precondition(tags[j] != 0, "\(e.id) lies beyond a hole in its probe path")
                j = (j &+ 1) & mask
            }
        }
        for i in 0..<capacity where tags[i] == 0 { precondition(slots[i] == nil, "slot \(i) is untagged but holds an entry") }
        precondition(occupied == count, "\(occupied) slots occupied, count \(count)")
        precondition(count * 4 <= capacity * 3, "load above 3/4")
    }
}
