//! A background thread of the daemon (the API, the state saver) that is told to stop and
//! joined when its handle is shut down or dropped.

use std::thread::JoinHandle;

pub struct ServiceThread {
    stop: Option<Box<dyn FnOnce() + Send>>,
    thread: Option<JoinHandle<()>>,
}

impl ServiceThread {
    /// `stop` tells the thread to finish (e.g. sends on its shutdown channel).
    pub fn new(stop: impl FnOnce() + Send + 'static, thread: JoinHandle<()>) -> Self {
        ServiceThread {
            stop: Some(Box::new(stop)),
            thread: Some(thread),
        }
    }

    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        if let Some(stop) = self.stop.take() {
            stop();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for ServiceThread {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}
