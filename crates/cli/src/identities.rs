//! Identities generated for the processes of one run of the demo or the benchmark.

use std::path::PathBuf;

use tidings::{AllowList, Identity};
use tidings_gms::ServiceSecurity;

/// A run's generated identities: the service's, and one file per process (mode 0600) in a
/// temporary directory of the run's own, removed when this is dropped.
pub(crate) struct RunIdentities {
    dir: PathBuf,
    /// The service's identity and its allow list, which holds every process's key.
    pub(crate) service: ServiceSecurity,
    /// Each process's identity file, by its slot.
    pub(crate) children: Vec<PathBuf>,
}

impl RunIdentities {
    /// An identity for the service and for each of `children` processes, all admitted, named
    /// `{run}-{slot}` on the allow list.
    pub(crate) fn new(run: &str, children: u32) -> Result<RunIdentities, String> {
        let dir = std::env::temp_dir().join(format!("tidings-{run}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut ids = RunIdentities {
            dir,
            service: ServiceSecurity {
                identity: Identity::generate().map_err(|e| e.to_string())?,
                allowed: AllowList::new(),
            },
            children: Vec::new(),
        };
        for i in 0..children {
            let identity = Identity::generate().map_err(|e| e.to_string())?;
            let path = ids.dir.join(format!("node-{i}.key"));
            identity.write_file(&path).map_err(|e| e.to_string())?;
            ids.service
                .allowed
                .insert(*identity.public(), &format!("{run}-{i}"));
            ids.children.push(path);
        }
        Ok(ids)
    }
}

impl Drop for RunIdentities {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
