//! The deterministic simulator of DESIGN.md section 9.

#![forbid(unsafe_code)]
