//! The delivery scheduler (paper 003). Under construction.
