/// What the reconciler remembers of one group (and, as the root, of the
/// plain parts of the whole set): the entries it claimed in order, its input,
/// its nested groups, and the message mapping applied to its entries' events.
final class GroupMemo {
    let key: GroupKey?
    let parent: GroupMemo?
    /// The reconciler's owner link (entries reach it through their group).
    let link: OwnerLink
    /// The group as last built (its key and input), and the same unretained
    /// (read on the skip path without reference counting).
    private(set) var node: GroupIdentity?
    private(set) var nodeRef: Unmanaged<GroupIdentity>?
    /// The set this group was last walked from (the desired set, for the
    /// root): it holds the taggers of the group's entries, which hold them
    /// unretained (see `ActiveSource`).
    var content: Subscriptions<ReconcileEngine.Erased>?
    /// Maps the group's messages to its parent's (nil: the same type).
    var forward: ((Any) -> Any)?
    /// The entries in desired order, unretained: the active table holds
    /// them, and an entry leaves every order before it leaves the table.
    @exclusivity(unchecked) var order: ContiguousArray<Unmanaged<ActiveSource>> = []
    @exclusivity(unchecked) var children: [GroupKey: GroupMemo] = [:]
    /// The nested groups in the order last walked, for positional lookup
    /// (unretained: `children` holds them).
    @exclusivity(unchecked) var childOrder: ContiguousArray<Unmanaged<GroupMemo>> = []
    /// The new child order, built only from where it first differs.
    @exclusivity(unchecked) var newChildOrder: ContiguousArray<Unmanaged<GroupMemo>> = []
    var childBuilding = false
    var childCursor = 0
    /// Entries claimed by this group and its nested groups.
    var subtreeCount = 0
    /// Duplicates seen in this group's last build (nested groups included):
    /// such a group is always built, since whether its copies lose depends
    /// on the other groups.
    var ownDuplicates = 0
    var subtreeDuplicates = 0
    var walkEpoch: UInt64 = 0
    var skipEpoch: UInt64 = 0
    var rebuildEpoch: UInt64 = 0
    // The state of the walk in progress.
    @exclusivity(unchecked) var cursor = 0
    @exclusivity(unchecked) var placed = 0
    @exclusivity(unchecked) var building = false
    /// Where the new order first differs from the old one (entries before
    /// it keep their positions and are all claimed).
    @exclusivity(unchecked) var divergence = 0
    @exclusivity(unchecked) var newOrder: ContiguousArray<Unmanaged<ActiveSource>> = []
    var visited = 0
    /// This group's position in its parent's child order (`GroupReuse`;
    /// last, so the walk's fields keep their places in the object).
    var childIndex = 0
    /// The reuse generation (`GroupReuse.live`) whose build was handed this
    /// group's node: one node serves one group of a build.
    var reuseGeneration: UInt64 = 0

    init(key: GroupKey?, parent: GroupMemo) {
        self.key = key
        self.parent = parent
        self.link = parent.link
        self.occurrence = key?.occurrence ?? 0
    }

    /// Which occurrence of its key among its siblings this group is.
    let occurrence: Int

    /// Where `child` stood in this group's last child order, if it is
    /// there (its `childIndex`, checked).
    func lastPosition(of child: GroupMemo) -> Int? {
        let i = child.childIndex
        guard i < childOrder.count, childOrder[i].toOpaque() == Unmanaged.passUnretained(child).toOpaque() else { return nil }
        return i
    }

    func setNode(_ node: GroupIdentity) {
        self.node = node
        nodeRef = .passUnretained(node)
    }

    init(link: OwnerLink) {
        self.key = nil
        self.parent = nil
        self.link = link
        self.occurrence = 0
    }

    /// `message` (of this group's type) mapped up to the runtime's type.
    func route(_ message: Any) -> Any {
        var m = message
        var g: GroupMemo? = self
        while let x = g {
            if let f = x.forward { m = f(m) }
            g = x.parent
        }
        return m
    }
}
