/// Builds `Subscriptions` from statements: single subscriptions, nested sets,
/// groups, arrays, `if`/`else`, optionals and `for` loops.
@resultBuilder
public enum SubscriptionsBuilder<Message> {
    /// One subscription.
    @inlinable public static func buildExpression(_ s: Subscription<Message>) -> Subscriptions<Message> { Subscriptions([s]) }
    /// An optional subscription (nothing when nil).
    @inlinable public static func buildExpression(_ s: Subscription<Message>?) -> Subscriptions<Message> { Subscriptions(s.map { [$0] } ?? []) }
    /// A nested set, in order.
    @inlinable public static func buildExpression(_ s: Subscriptions<Message>) -> Subscriptions<Message> { s }
    /// An array of subscriptions, in order.
    @inlinable public static func buildExpression(_ s: [Subscription<Message>]) -> Subscriptions<Message> { Subscriptions(s) }
    /// The statements' subscriptions, in order.
    @inlinable public static func buildBlock(_ parts: Subscriptions<Message>...) -> Subscriptions<Message> { concatenate(parts) }
    /// One statement's subscriptions (a `for` body: no array of one).
    @inlinable public static func buildBlock(_ part: Subscriptions<Message>) -> Subscriptions<Message> { part }
    /// An `if` without `else`.
    @inlinable public static func buildOptional(_ part: Subscriptions<Message>?) -> Subscriptions<Message> { part ?? .none }
    /// The first branch of an `if`/`else` or `switch`.
    @inlinable public static func buildEither(first: Subscriptions<Message>) -> Subscriptions<Message> { first }
    /// The second branch of an `if`/`else` or `switch`.
    @inlinable public static func buildEither(second: Subscriptions<Message>) -> Subscriptions<Message> { second }
    /// A `for` loop's subscriptions, in order.
    @inlinable public static func buildArray(_ parts: consuming [Subscriptions<Message>]) -> Subscriptions<Message> { concatenate(parts) }
    /// An `if #available` branch.
    @inlinable public static func buildLimitedAvailability(_ part: Subscriptions<Message>) -> Subscriptions<Message> { part }

    @inlinable static func concatenate(_ parts: consuming [Subscriptions<Message>]) -> Subscriptions<Message> {
        if parts.count == 1 { return parts[0] }
        var all = Subscriptions<Message>()
        // The sets are moved out of the array (it is the builder's, given
        // up): their parts change owner without reference counting. The
        // first non-empty set is taken as is; room for the others' parts
        // is reserved once.
        parts.withUnsafeMutableBufferPointer { sets in
            guard let base = sets.baseAddress else { return }
            var i = 0
            while i < sets.count && sets[i].storage == nil { i += 1 }
            guard i < sets.count else { return }
            all = (base + i).move()
            (base + i).initialize(to: Subscriptions())
            all.reserveParts(sets.count - i - 1)
            i += 1
            while i < sets.count {
                let next = (base + i).move()
                (base + i).initialize(to: Subscriptions())
                all.append(next)
                i += 1
            }
        }
        return all
    }
}
