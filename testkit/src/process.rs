//! A child process a test owns: killed when dropped, and killed, frozen or thawed on
//! purpose, as a fault would. The broker, Redis, core and edge processes of the stacks
//! each hold one.

use std::process::Child;
use std::time::Duration;

#[derive(Default)]
pub struct Process {
    child: Option<Child>,
}

impl Process {
    /// Owns `child` from now on (killing whatever ran before).
    pub fn set(&mut self, child: Child) {
        self.kill();
        self.child = Some(child);
    }

    /// Kills the process at once (SIGKILL), as a crash or an OOM kill would, and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes the process (SIGSTOP): its connections stay open and nothing answers, as in
    /// a long pause of its VM or a stalled disk.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// Lets a frozen process go on (SIGCONT).
    pub fn unpause(&self) {
        self.signal("CONT");
    }

    /// Asks the process to stop (SIGTERM), as an orchestrator does.
    pub fn terminate(&self) {
        self.signal("TERM");
    }

    /// Whether a process is owned and was not killed on purpose (it may still have died).
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Whether the process has exited (reaping it if so).
    pub fn exited(&mut self) -> bool {
        match &mut self.child {
            Some(child) => !matches!(child.try_wait(), Ok(None)),
            None => true,
        }
    }

    /// Sends `SIG<name>` and waits for the process to exit (a shutdown it performs itself,
    /// such as PostgreSQL's immediate stop on SIGQUIT).
    pub fn stop_with(&mut self, name: &str) {
        self.signal(name);
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }

    /// Freezes the process and every child it has forked (SIGSTOP to the children first,
    /// then to it, so none is forked after the children were frozen): a whole server
    /// stalled, as PostgreSQL is when its disk or its VM stops answering.
    pub fn pause_with_children(&self) {
        if let Some(child) = &self.child {
            self.signal("STOP");
            let _ = std::process::Command::new("pkill")
                .args(["-STOP", "-P", &child.id().to_string()])
                .status();
        }
    }

    /// Kills every child the process has forked, then the process (SIGKILL), and reaps it:
    /// a whole server lost at once, with no chance to clean up.
    pub fn kill_with_children(&mut self) {
        if let Some(child) = &self.child {
            let _ = std::process::Command::new("pkill")
                .args(["-KILL", "-P", &child.id().to_string()])
                .status();
        }
        self.kill();
    }

    /// Lets a process frozen with [`Process::pause_with_children`] go on, children first.
    pub fn unpause_with_children(&self) {
        if let Some(child) = &self.child {
            let _ = std::process::Command::new("pkill")
                .args(["-CONT", "-P", &child.id().to_string()])
                .status();
            self.signal("CONT");
        }
    }

    /// `SIG<name>` with kill(1): the workspace forbids `unsafe`, so no libc.
    fn signal(&self, name: &str) {
        if let Some(child) = &self.child {
            let _ = std::process::Command::new("kill")
                .args([format!("-{name}"), child.id().to_string()])
                .status();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether something accepts connections on `127.0.0.1:port` within `within`.
pub async fn listening(port: u16, within: Duration) -> bool {
    tokio::time::timeout(within, async {
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .is_ok()
}
