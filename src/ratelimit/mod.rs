//! A target's rate limits, in one place: the limits a connection declares ([`limits`]),
//! what the target's headers state ([`headers`]), a budget's shared state and how slots
//! are leased from it ([`budget`]), the learned rate ([`controller`]), 429 blocks
//! ([`blocks`]) and the in-process pacer that hands slots to calls ([`pacer`]).
//!
//! The chain asks it for request slots and hands it one signal per answer
//! ([`answer::Answer`]: sent, refused with a wait, or not sent, with the headers stating a
//! quota, what remains, the reset); the [`answer::Verdict`] says what the chain does next.

pub mod answer;
pub mod blocks;
pub mod budget;
pub mod controller;
pub mod headers;
pub mod limits;
pub mod pacer;
#[cfg(test)]
mod sim;
