// ReconcileTesting is the Swift Testing side of the test kit; the virtual
// driver, transcripts and replay live in ReconcileReplay (no Swift Testing,
// so a shipped binary can replay) and come with this module.
@_exported import ReconcileReplay
