#!/usr/bin/env bash
# Every recipe of docs/hacking.md applied to a copy of the tree as a reader makes it (test_smoke.apply_recipe), the
# docs' flag tables rewritten as the recipes say, then the README's test command in that copy: a student's correct
# hack keeps test_smoke.py green. (dev/test_dev.py's size claim and story map are the maintainers': they go red there.)
#   bash dev/recipes_suite.sh [DIR]      # DIR: where the copy goes (default: a new temporary folder)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-$(mktemp -d)}
git ls-files | tar -cf - -T - | tar -xf - -C "$dir"
python3 - "$dir" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import test_smoke
recipes = test_smoke.readme_recipes()
for name in recipes:
    test_smoke.apply_recipe(recipes[name], sys.argv[1])
print(f"applied to {sys.argv[1]}: {', '.join(recipes)}")
PY
cd "$dir"
python3 tools/flags_md.py --write
python3 -m pytest -q -n 2 -p no:cacheprovider test_smoke.py
