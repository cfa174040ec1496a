#!/bin/sh
# Builds the API reference of the library modules (Reconcile,
# ReconcileTesting, ReconcileReplay, ReconcileSystemd, ReconcileTranscript) into one static site with the
# toolchain's `docc`: symbol graphs come from the compiler
# (-emit-symbol-graph) in a separate scratch path, so the regular build is
# not disturbed. Fails on any docc warning and on any public symbol without
# a doc comment.
set -eu
SWIFT=${SWIFT:-swift}
out=.build/docs
graphs=$PWD/$out/symbol-graphs
modules="Reconcile ReconcileTesting ReconcileReplay ReconcileSystemd ReconcileTranscript"
mkdir -p "$graphs"
for product in ReconcileTesting ReconcileSystemd; do
    "$SWIFT" build --scratch-path "$out/build" --product "$product" \
        -Xswiftc -emit-symbol-graph -Xswiftc -emit-symbol-graph-dir -Xswiftc "$graphs" \
        -Xswiftc -symbol-graph-minimum-access-level -Xswiftc public >"$out/build.log" 2>&1 \
        || { cat "$out/build.log"; exit 1; }
done

# Every public symbol declared in our sources has a doc comment.
undocumented=$(for m in $modules; do
    for f in "$graphs/$m.symbols.json" "$graphs/$m"@*.symbols.json; do
        [ -e "$f" ] || continue
        jq -r '.symbols[] | select(.accessLevel == "public" or .accessLevel == "open")
               | select(.docComment == null and .location != null)
               | "\(.location.uri | sub("^.*?/Sources/"; "Sources/")):\(.location.position.line + 1): \(.pathComponents | join("."))"' "$f"
    done
done | sort -u)
if [ -n "$undocumented" ]; then
    echo "public symbols without a doc comment:" >&2
    echo "$undocumented" >&2
    exit 1
fi

archives=""
for m in $modules; do
    dir=$out/graphs-$m
    rm -rf "$dir" "$out/$m.doccarchive"
    mkdir -p "$dir"
    cp "$graphs/$m.symbols.json" "$dir/"
    for f in "$graphs/$m"@*.symbols.json; do [ -e "$f" ] && cp "$f" "$dir/"; done
    docc convert "Sources/$m/$m.docc" --additional-symbol-graph-dir "$dir" \
        --fallback-display-name "$m" --fallback-bundle-identifier "reconcile.$m" \
        --output-path "$out/$m.doccarchive" --warnings-as-errors >"$out/docc-$m.log" 2>&1 \
        || { cat "$out/docc-$m.log"; exit 1; }
    if grep -q "warning:" "$out/docc-$m.log"; then cat "$out/docc-$m.log"; exit 1; fi
    archives="$archives $out/$m.doccarchive"
done
rm -rf "$out/site"
docc merge $archives --synthesized-landing-page-name Reconcile --output-path "$out/site" >"$out/docc-merge.log" 2>&1 \
    || { cat "$out/docc-merge.log"; exit 1; }
echo "docs: $out/site (serve it: python3 -m http.server -d $out/site 8000, then open http://localhost:8000/documentation/)"
