// The transcript format (its encoder, its parser and `JSONValue`) lives in
// ReconcileTranscript; a reader of transcripts gets it with this module.
@_exported import ReconcileTranscript
