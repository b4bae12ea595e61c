//! The gate's Lua scripts, read at build time from the top-level `lua/` folder, where they
//! are reviewed and versioned beside `migrations/`. One table names them all: the gate
//! loads every entry at start-up, and a test fails if `lua/` holds a script the table
//! lacks (the table cannot name a missing file: `include_str!` would not build).

use redis::Script;

/// One script: its name (how measurements and logs call it; Redis's slow log shows only
/// the SHA1), its path under `lua/`, and its source.
#[derive(Debug, Clone, Copy)]
pub struct ScriptSource {
    pub name: &'static str,
    pub path: &'static str,
    pub source: &'static str,
}

macro_rules! lua {
    ($name:literal, $path:literal) => {
        ScriptSource {
            name: $name,
            path: $path,
            source: include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../lua/", $path)),
        }
    };
}

/// Every script of the gate, by family: the reserve path, loading and generations,
/// reconciliation.
pub const SCRIPT_SOURCES: [ScriptSource; 12] = [
    lua!("reserve", "reserve/reserve.lua"),
    lua!("mark", "reserve/mark.lua"),
    lua!("release", "reserve/release.lua"),
    lua!("settle", "reserve/settle.lua"),
    lua!("load_begin", "load/load_begin.lua"),
    lua!("load_fill", "load/load_fill.lua"),
    lua!("load_open", "load/load_open.lua"),
    lua!("raise", "load/raise.lua"),
    lua!("amend", "load/amend.lua"),
    lua!("snapshot", "reconcile/snapshot.lua"),
    lua!("counts", "reconcile/counts.lua"),
    lua!("adjust", "reconcile/adjust.lua"),
];

/// The reserve script, public so the benchmark can measure it alone.
pub const RESERVE_SCRIPT: &str = SCRIPT_SOURCES[0].source;

/// The scripts as `redis::Script`s (each knows its SHA1 and runs by EVALSHA).
pub(super) struct Scripts {
    pub reserve: Script,
    pub mark: Script,
    pub release: Script,
    pub settle: Script,
    pub load_begin: Script,
    pub load_fill: Script,
    pub load_open: Script,
    pub raise: Script,
    pub amend: Script,
    pub snapshot: Script,
    pub counts: Script,
    pub adjust: Script,
}

impl Scripts {
    pub fn new() -> Self {
        let [reserve, mark, release, settle, load_begin, load_fill, load_open, raise, amend, snapshot, counts, adjust] =
            SCRIPT_SOURCES.map(|s| Script::new(s.source));
        Self {
            reserve,
            mark,
            release,
            settle,
            load_begin,
            load_fill,
            load_open,
            raise,
            amend,
            snapshot,
            counts,
            adjust,
        }
    }

    /// Every script, for SCRIPT LOAD at start-up. The destructuring is exhaustive: a script
    /// added to the struct and not listed here does not build.
    pub fn all(&self) -> [&Script; 12] {
        let Self {
            reserve,
            mark,
            release,
            settle,
            load_begin,
            load_fill,
            load_open,
            raise,
            amend,
            snapshot,
            counts,
            adjust,
        } = self;
        [
            reserve, mark, release, settle, load_begin, load_fill, load_open, raise, amend,
            snapshot, counts, adjust,
        ]
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use super::*;

    fn lua_files(dir: &Path, under: &str, into: &mut BTreeSet<String>) {
        let entries = std::fs::read_dir(dir).expect("lua/ is readable");
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .expect("a UTF-8 name")
                .to_owned();
            let relative = if under.is_empty() {
                name
            } else {
                format!("{under}/{name}")
            };
            if path.is_dir() {
                lua_files(&path, &relative, into);
            } else if relative.ends_with(".lua") {
                into.insert(relative);
            }
        }
    }

    #[test]
    fn every_script_in_lua_is_the_gates_and_every_one_is_loaded() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../lua");
        let mut on_disk = BTreeSet::new();
        lua_files(&dir, "", &mut on_disk);
        let named: BTreeSet<String> = SCRIPT_SOURCES.iter().map(|s| s.path.to_owned()).collect();
        assert_eq!(on_disk, named, "lua/ and the gate's table differ");
        let names: BTreeSet<&str> = SCRIPT_SOURCES.iter().map(|s| s.name).collect();
        assert_eq!(
            names.len(),
            SCRIPT_SOURCES.len(),
            "two scripts share a name"
        );

        // What the gate loads at start-up is every script of the table, each once.
        let loaded: BTreeSet<String> = Scripts::new()
            .all()
            .iter()
            .map(|s| s.get_hash().to_owned())
            .collect();
        let table: BTreeSet<String> = SCRIPT_SOURCES
            .iter()
            .map(|s| Script::new(s.source).get_hash().to_owned())
            .collect();
        assert_eq!(loaded, table);
        assert_eq!(
            loaded.len(),
            SCRIPT_SOURCES.len(),
            "two scripts are the same"
        );
    }
}
