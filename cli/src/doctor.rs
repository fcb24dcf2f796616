//! `redlock doctor`.

use crate::args::DoctorArgs;
use crate::exit::Failure;
use crate::settings::Settings;

pub(crate) async fn run(_settings: &Settings, _args: &DoctorArgs) -> Result<u8, Failure> {
    Err(Failure::usage("doctor: not yet"))
}
