"""Column declarations of every egolake table (see docs/ARCHITECTURE.md, "Table contract")."""

from __future__ import annotations

import pyarrow as pa

from schemas.base import TableSchema

__all__ = [
    "ACTIONS",
    "BA_CAMERAS",
    "BA_POINTS",
    "CAMERAS",
    "CAMERA_POSES",
    "FEATURES",
    "FRAMES",
    "HANDS_CAM",
    "HANDS_WORLD",
    "KEYFRAMES",
    "KEYFRAME_POSES",
    "MAP_POINTS",
    "QA",
    "QUARANTINE",
    "ROBOT_ACTIONS",
    "ROBOT_QUALITY",
    "RUNS",
    "SHARDS",
    "TRACKS",
    "VIDEOS",
]

_F64_LIST = pa.list_(pa.float64())

VIDEOS = TableSchema(
    name="videos",
    version="2",
    key=("episode_id",),
    partition_key="episode_id",
    arrow=pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),  # first 16 hex of the content SHA-256
            pa.field("source_path", pa.string(), nullable=False),
            pa.field("kind", pa.string(), nullable=False),  # video | image_sequence
            pa.field("size_bytes", pa.int64()),
            pa.field("content_sha256", pa.string()),
            pa.field("container", pa.string()),
            pa.field("codec", pa.string()),
            pa.field("width", pa.int32()),  # coded size, before rotation
            pa.field("height", pa.int32()),
            pa.field("rotation_deg", pa.int32()),  # display rotation from container metadata
            pa.field("fps", pa.float64()),  # average rate; per-frame times are in `frames.ts_s`
            pa.field("frame_count", pa.int64()),  # counted by decoding, not read from the header
            pa.field("duration_s", pa.float64()),
            pa.field("variable_frame_rate", pa.bool_()),
            pa.field("has_audio", pa.bool_()),
            pa.field("decoder", pa.string()),  # backend that decodes it: decord | pyav | images
            pa.field("stereo_partner_path", pa.string()),
            pa.field("calibration_json", pa.string()),  # parsed calibration sidecar, or null
            pa.field("imu_path", pa.string()),  # file the IMU is read from: the sidecar, or the video (gpmf)
            pa.field("imu_source", pa.string()),  # sidecar | gpmf (the video's GoPro GPMF track) | null
            pa.field("imu_warning", pa.string()),  # why an embedded IMU was not attached, or what was dropped
            pa.field("task_text", pa.string()),
            pa.field("phashes", pa.list_(pa.int64())),  # 64-bit perceptual hashes of sampled frames
        ]
    ),
)

SHARDS = TableSchema(
    name="shards",
    version="1",
    key=("episode_id", "shard_idx"),
    partition_key="episode_id",
    arrow=pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("shard_idx", pa.int32(), nullable=False),
            pa.field("source_path", pa.string(), nullable=False),
            pa.field("kind", pa.string(), nullable=False),
            pa.field("decoder", pa.string()),
            pa.field("frame_start", pa.int64(), nullable=False),  # decode range [frame_start, frame_stop)
            pa.field("frame_stop", pa.int64(), nullable=False),  # includes the overlap with neighbours
            pa.field("own_start", pa.int64(), nullable=False),  # it writes frames [own_start, own_stop)
            pa.field("own_stop", pa.int64(), nullable=False),
        ]
    ),
)

QUARANTINE = TableSchema(
    name="quarantine",
    version="1",
    key=("source_path",),
    partition_key="source_path",
    arrow=pa.schema(
        [
            pa.field("source_path", pa.string(), nullable=False),
            pa.field("reason_code", pa.string(), nullable=False),  # one of udfs.media.reasons.REASONS
            pa.field("message", pa.string(), nullable=False),  # human-readable, names file and problem
            pa.field("size_bytes", pa.int64()),
            pa.field("content_sha256", pa.string()),
            pa.field("duplicate_of", pa.string()),  # source_path kept instead, for duplicates
        ]
    ),
)

RUNS = TableSchema(
    name="runs",
    version="2",
    key=("run_id", "stage", "episode_id"),
    partition_key="run_id",
    lineage=False,  # carries run_id, stage_version, config_hash itself
    arrow=pa.schema(
        [
            pa.field("run_id", pa.string(), nullable=False),
            pa.field("stage", pa.string(), nullable=False),
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("status", pa.string(), nullable=False),  # ok | failed | skipped
            pa.field("started", pa.timestamp("us", tz="UTC")),
            pa.field("finished", pa.timestamp("us", tz="UTC")),
            pa.field("rows", pa.int64()),
            pa.field("error", pa.string()),  # "ErrorClass: message" when failed
            # v2: the episode's units (shards or the episode) on the executors, summed: wall seconds and
            # CPU seconds (worker process and its waited children, all threads); null where not measured
            # (skipped rows, a job that died). Frames and video seconds come from `videos`.
            pa.field("unit_s", pa.float64()),
            pa.field("cpu_s", pa.float64()),
            pa.field("config_hash", pa.string(), nullable=False),
            pa.field("stage_version", pa.string(), nullable=False),
        ]
    ),
)

FRAMES = TableSchema(
    name="frames",
    version="1",
    key=("episode_id", "frame_idx"),
    partition_key="episode_id",
    arrow=pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("frame_idx", pa.int64(), nullable=False),  # 0-based, decode order
            pa.field("ts_s", pa.float64(), nullable=False),  # presentation time, seconds
            pa.field("shard_idx", pa.int32(), nullable=False),
            pa.field("width", pa.int32()),  # size as decoded for the pipeline (after resize)
            pa.field("height", pa.int32()),
            pa.field("brightness", pa.float32()),  # mean luma, 0..255
            pa.field("sharpness", pa.float32()),  # variance of the Laplacian of luma (blur < ~50)
        ]
    ),
)

HANDS_CAM = TableSchema(
    name="hands_cam",
    version="1",
    key=("episode_id", "frame_idx", "hand_slot"),
    partition_key="episode_id",
    arrow=pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("frame_idx", pa.int64(), nullable=False),
            pa.field("hand_slot", pa.int32(), nullable=False),  # order of the hand in the estimator's output
            pa.field("keypoints_px", pa.list_(pa.float32())),  # 21 x (u, v) as detected, pixels
            pa.field("score", pa.float32()),  # detector confidence that this is a hand, 0..1
            pa.field("handedness", pa.string()),  # left | right, anatomical, as detected (not trusted alone)
            pa.field("handedness_score", pa.float32()),  # probability of `handedness`, 0.5..1
            pa.field("keypoints_cam_m", pa.list_(pa.float32())),  # 21 x (x, y, z) in camera, m; NaN: no fit
            pa.field("fit_valid", pa.bool_()),  # the metric fit converged inside the allowed depth range
            pa.field("fit_residual_px", pa.float32()),  # RMS reprojection error of the fit, pixels
            pa.field("fit_keypoints", pa.int32()),  # keypoints supporting the fit
            pa.field("shape_source", pa.string()),  # canonical (skeleton) | model (its own shape) | template
            pa.field("model_palm_size_m", pa.float32()),  # model shape's palm size (model fits); else NaN
            pa.field("box_px", pa.list_(pa.float32())),  # x0, y0, x1, y1 around the hand with margin, px
            pa.field("depth_source", pa.string()),  # where metric depth comes from: hand_size_prior
            pa.field("intrinsics_px", pa.list_(pa.float64())),  # fx, fy, cx, cy the fit used (pinhole)
            pa.field("intrinsics_source", pa.string()),  # sidecar | metadata | prior
            pa.field("image_width", pa.int32()),  # decoded image size the pixels refer to
            pa.field("image_height", pa.int32()),
        ]
    ),
)

HANDS_WORLD = TableSchema(
    name="hands_world",
    version="2",
    key=("episode_id", "frame_idx", "identity"),
    partition_key="episode_id",
    arrow=pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("frame_idx", pa.int64(), nullable=False),
            pa.field("identity", pa.string(), nullable=False),  # wearer_left | wearer_right | other_<n>
            pa.field("ts_s", pa.float64()),  # presentation time, seconds
            pa.field("keypoints_world_m", pa.list_(pa.float32())),  # 21 x (x, y, z) world frame, metres
            pa.field("filled", pa.bool_()),  # filled in a short gap (no observation in this frame)
            pa.field("score", pa.float32()),  # detector score; null when filled
            pa.field("handedness", pa.string()),  # detector's guess in this frame; null when filled
            pa.field("identity_switch", pa.bool_()),  # another track held it at its last sighting
            pa.field("scale_source", pa.string()),  # stereo | imu | hands | user | none
            pa.field("metres_per_unit", pa.float64()),  # metres per camera_poses unit; null when source none
            pa.field("metres_per_unit_std", pa.float64()),  # its standard error; null: unknown (user) or none
            pa.field("gravity_dir_world", _F64_LIST),  # unit gravity (down) in world, 3 floats; null: no IMU
            pa.field("reprojection_error_px", pa.float32()),  # RMS error of the metric fit; null when filled
            pa.field("supporting_keypoints", pa.int32()),  # keypoints that supported the fit; 0 when filled
            pa.field("depth_source", pa.string()),  # hand_size_prior; "gap_fill" when filled
            pa.field("hand_size_factor", pa.float32()),  # factor holding the hand's size constant (1 = none)
            pa.field("hand_slot", pa.int32()),  # hands_cam row it came from; null when filled
        ]
    ),
)

FEATURES = TableSchema(
    name="features",
    version="2",
    key=("episode_id", "shard_idx", "frame_idx"),
    partition_key="episode_id",
    arrow=pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("shard_idx", pa.int32(), nullable=False),
            pa.field("frame_idx", pa.int64(), nullable=False),
            pa.field("owned", pa.bool_(), nullable=False),  # owned by the shard; false: overlap, for linking
            pa.field("track_ids", pa.list_(pa.int64())),  # KLT track ids (N,), from shard_idx << 32
            pa.field("uv_px", pa.list_(pa.float32())),  # distorted pixels (u0, v0, u1, ...), (2N,)
            # upright ORB descriptor of each track, 32 bytes each in track order (32N bytes; zeros: none);
            # null on frames without descriptors (every priors.features.descriptor_every_frames-th frame)
            pa.field("descriptors", pa.binary()),
        ]
    ),
)

# Camera-pose columns: a transform names its target and source frame; quaternions are wxyz.
# Units are in the name: `_m` metres, `_mu` map units (the monocular map's arbitrary length, one per
# episode). Camera and map tables stay in map units; `hands_world.metres_per_unit` turns them into metres.
_WORLD_FROM_CAM = (
    pa.field("world_from_cam_q_wxyz", _F64_LIST),  # rotation, 4 floats; null when the frame has no pose
    pa.field("world_from_cam_t_mu", _F64_LIST),  # camera centre in world, 3 floats, map units
)

CAMERAS = TableSchema(
    name="cameras",
    version="1",
    key=("episode_id",),
    partition_key="episode_id",
    arrow=pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("width", pa.int32(), nullable=False),  # decoded frame size the intrinsics refer to
            pa.field("height", pa.int32(), nullable=False),
            pa.field("fx", pa.float64(), nullable=False),  # pixels
            pa.field("fy", pa.float64(), nullable=False),
            pa.field("cx", pa.float64(), nullable=False),
            pa.field("cy", pa.float64(), nullable=False),
            pa.field("model", pa.string(), nullable=False),  # pinhole | radtan | fisheye
            pa.field("dist", _F64_LIST),  # distortion coefficients in OpenCV order, 0 or 4
            pa.field("intrinsics_source", pa.string(), nullable=False),  # sidecar | metadata | prior
        ]
    ),
)

TRACKS = TableSchema(
    name="tracks",
    version="2",
    key=("episode_id", "frame_idx"),
    partition_key="episode_id",
    arrow=pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("frame_idx", pa.int64(), nullable=False),
            # lost | static | tracking | rotation_only
            pa.field("tracking_state", pa.string(), nullable=False),
            pa.field("segment_id", pa.int32(), nullable=False),  # a new segment starts after each loss
            pa.field("is_keyframe", pa.bool_(), nullable=False),
            pa.field("num_features", pa.int32()),  # linked KLT tracks in the frame (after hand masking)
            pa.field("num_inliers", pa.int32()),  # map-point inliers (shared rays while static)
            pa.field("reproj_error_px", pa.float32()),  # RMS reprojection error of inliers; null: unknown
            *_WORLD_FROM_CAM,  # the tracking (pre-BA) pose
        ]
    ),
)

KEYFRAMES = TableSchema(
    name="keyframes",
    version="2",
    key=("episode_id", "frame_idx"),
    partition_key="episode_id",
    arrow=pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("frame_idx", pa.int64(), nullable=False),
            pa.field("segment_id", pa.int32(), nullable=False),
            *_WORLD_FROM_CAM,  # tracking pose of the keyframe (BA input)
            pa.field("obs_point_idx", pa.list_(pa.int64())),  # observed `map_points.point_idx`, (K,)
            pa.field("obs_xy", _F64_LIST),  # undistorted normalised (x0/z0, y0/z0, ...), (2K,)
        ]
    ),
)

MAP_POINTS = TableSchema(
    name="map_points",
    version="3",
    key=("episode_id", "point_idx"),
    partition_key="episode_id",
    arrow=pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("point_idx", pa.int64(), nullable=False),  # 0-based within the episode
            pa.field("track_id", pa.int64(), nullable=False),  # linked KLT track it was triangulated from
            # further tracks that see it (found again by relocalisation, or merged from a duplicate point)
            pa.field("alias_track_ids", pa.list_(pa.int64())),
            pa.field("segment_id", pa.int32(), nullable=False),  # map; -1: merged into another point
            pa.field("x_in_world_mu", _F64_LIST),  # 3 floats, map units, tracking estimate (BA input)
        ]
    ),
)

KEYFRAME_POSES = TableSchema(
    name="keyframe_poses",
    version="2",
    key=("episode_id", "frame_idx"),
    partition_key="episode_id",
    arrow=pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("frame_idx", pa.int64(), nullable=False),
            pa.field("segment_id", pa.int32(), nullable=False),
            *_WORLD_FROM_CAM,  # after global bundle adjustment
            pa.field("obs_point_idx", pa.list_(pa.int64())),  # observations kept by BA, (K,)
            pa.field("obs_xy", _F64_LIST),  # their undistorted normalised coordinates, (2K,)
        ]
    ),
)

BA_POINTS = TableSchema(
    name="ba_points",
    version="2",
    key=("episode_id", "point_idx"),
    partition_key="episode_id",
    arrow=pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("point_idx", pa.int64(), nullable=False),  # as in `map_points`
            pa.field("x_in_world_mu", _F64_LIST),  # 3 floats, map units, after global BA (all points)
        ]
    ),
)

BA_CAMERAS = TableSchema(
    name="ba_cameras",
    version="2",
    key=("episode_id",),
    partition_key="episode_id",
    arrow=pa.schema(
        [
            # `cameras` after global BA: when not calibrated, the focal and a radial term k1 (model
            # radtan, dist (k1, 0, 0, 0)) estimated from the footage, intrinsics_source estimated;
            # keyframe_poses, ba_points and camera_poses agree with these intrinsics
            *CAMERAS.arrow,
            pa.field("focal_prior_px", pa.float64()),  # mean focal of `cameras` (what tracking used), pixels
            pa.field("focal_std_px", pa.float64()),  # refined focal's posterior std, px; null: not refined
            # fixed (calibrated) | refined | prior kept: unobservable | implausible | unconverged | poor_fit
            pa.field("focal_status", pa.string()),
            pa.field("radial_std", pa.float64()),  # k1's posterior std; null: not refined
            # fixed | refined | k1 kept at 0: unobservable | implausible | negligible (or the focal's status)
            pa.field("radial_status", pa.string()),
        ]
    ),
)

CAMERA_POSES = TableSchema(
    name="camera_poses",
    version="2",
    key=("episode_id", "frame_idx"),
    partition_key="episode_id",
    arrow=pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("frame_idx", pa.int64(), nullable=False),
            pa.field("ts_s", pa.float64()),  # presentation time, seconds (from `frames`)
            *_WORLD_FROM_CAM,  # final pose; null only when no frame of the episode could be posed
            # keyframe | motion_only | rotation_only | interpolated
            pa.field("pose_quality", pa.string(), nullable=False),
            # lost | static | tracking | rotation_only
            pa.field("tracking_state", pa.string(), nullable=False),
            pa.field("segment_id", pa.int32(), nullable=False),
            pa.field("is_keyframe", pa.bool_(), nullable=False),
            pa.field("num_inliers", pa.int32()),  # inliers of the final pose
            pa.field("reproj_error_px", pa.float32()),  # RMS reprojection error of inliers; null: unknown
        ]
    ),
)

ACTIONS = TableSchema(
    name="actions",
    version="1",
    key=("episode_id", "identity", "segment_idx"),
    partition_key="episode_id",
    arrow=pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("identity", pa.string(), nullable=False),  # wearer_left | wearer_right
            pa.field("segment_idx", pa.int32(), nullable=False),  # 0-based, in time order per hand
            # idle | reach | grasp | manipulate | release | missing
            pa.field("label", pa.string(), nullable=False),
            pa.field("frame_start", pa.int64(), nullable=False),  # first frame of the segment
            pa.field("frame_stop", pa.int64(), nullable=False),  # one past its last frame
            pa.field("ts_start_s", pa.float64()),
            pa.field("ts_stop_s", pa.float64()),  # presentation time of its last frame
            pa.field("mean_wrist_speed_mps", pa.float32()),
            pa.field("mean_grip_aperture_m", pa.float32()),  # thumb tip to index tip
            pa.field("task_text", pa.string()),  # the episode's task
            pa.field("task_source", pa.string()),  # sidecar | conf
        ]
    ),
)

ROBOT_ACTIONS = TableSchema(
    name="robot_actions",
    version="4",
    key=("episode_id", "embodiment", "identity", "step_idx"),
    partition_key="episode_id",
    arrow=pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("embodiment", pa.string(), nullable=False),  # profile: conf/embodiments/<name>.yaml
            pa.field("identity", pa.string(), nullable=False),  # the wearer hand it follows
            pa.field("step_idx", pa.int64(), nullable=False),  # control step k: first ts_s + k / control_fps
            pa.field("control_fps", pa.int32(), nullable=False),  # the profile's control rate, Hz
            pa.field("frame_idx", pa.int64(), nullable=False),  # source frame nearest in time (sample, hold)
            pa.field("ts_s", pa.float64()),  # the step's time, seconds (the video's clock)
            pa.field("refused", pa.string()),  # why the robot was not retargeted (every step); null: it was
            pa.field("scale_source", pa.string()),  # the hands' metric scale: hands_world.scale_source
            pa.field("scale_rel_std", pa.float32()),  # its relative standard error; null: unknown or none
            pa.field("joint_names", pa.list_(pa.string())),  # order of `joint_positions`
            pa.field("joint_positions", _F64_LIST),  # rad or m, (J,); null where the hand is missing
            pa.field("gripper", pa.float64()),  # gripper command (profile units); null: no hand, or a hand
            pa.field("ee_target_base", _F64_LIST),  # wanted (smoothed) tool pose in the robot base, 4x4; arms
            pa.field("ee_base", _F64_LIST),  # reached tool pose, 4x4 row-major; arms
            pa.field("ee_error_m", pa.float32()),  # arm: tool to the smoothed target; hand: vector error
            pa.field("hand_error_m", pa.float32()),  # arm: tool to the hand's own target; hand: as above
            pa.field("ee_error_rad", pa.float32()),  # rotation error to the target as the profile keeps it
            pa.field("reachable", pa.bool_()),  # within the profile's tolerances; false: flagged, not used
            pa.field("hand_state", pa.string()),  # observed | filled (valid); missing | beyond_reach (not)
            pa.field("approach_error_rad", pa.float32()),  # approach-axis error (profile's orientation); arms
            pa.field("closing_error_rad", pa.float32()),  # closing-axis error; arms
            pa.field("target_shift_m", pa.float32()),  # smoothed target to the hand's, base frame; arms
            pa.field("arm_points_world", _F64_LIST),  # stick figure: base, joints, tool; world, m, (P, 3)
        ]
    ),
)

ROBOT_QUALITY = TableSchema(
    name="robot_quality",
    version="2",
    key=("episode_id", "embodiment"),
    partition_key="episode_id",
    arrow=pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("embodiment", pa.string(), nullable=False),
            pa.field("kind", pa.string()),  # arm | hand
            pa.field("identities", pa.list_(pa.string())),  # the followed wearer hands (figures pool them)
            pa.field("passed", pa.bool_(), nullable=False),  # within retarget.quality; false: left out
            pa.field("flags", pa.list_(pa.string())),  # codes of the failed checks
            pa.field("reasons", pa.list_(pa.string())),  # one sentence per flag
            pa.field("steps", pa.int64()),  # control steps x followed hands
            pa.field("valid_steps", pa.int64()),  # with a hand observed or gap-filled, within reach
            pa.field("filled_steps", pa.int64()),
            pa.field("missing_steps", pa.int64()),
            pa.field("beyond_reach_steps", pa.int64()),
            pa.field("reachable_steps", pa.int64()),  # valid and within the profile's tolerances
            pa.field("valid_fraction", pa.float64()),
            pa.field("reachable_fraction", pa.float64()),  # of the valid steps
            pa.field("position_error_median_m", pa.float64()),  # tool to the hand (arm); vector error (hand)
            pa.field("position_error_p95_m", pa.float64()),
            pa.field("tracking_error_median_m", pa.float64()),  # tool to the smoothed target (arm)
            pa.field("tracking_error_p95_m", pa.float64()),
            pa.field("approach_error_median_rad", pa.float64()),
            pa.field("approach_error_p95_rad", pa.float64()),
            pa.field("closing_error_median_rad", pa.float64()),
            pa.field("closing_error_p95_rad", pa.float64()),
            pa.field("target_shift_p95_m", pa.float64()),  # how far smoothing moved the targets
            pa.field("position_tol_m", pa.float64()),  # the profile's tolerances, for the record
            pa.field("approach_tol_rad", pa.float64()),
            pa.field("closing_tol_rad", pa.float64()),
            pa.field("limit_violations", pa.int64()),
            pa.field("speed_violations", pa.int64()),
            pa.field("acceleration_violations", pa.int64()),
            pa.field("hands_json", pa.string()),  # per hand: figures, world_from_base (4x4), base score
        ]
    ),
)

QA = TableSchema(
    name="qa",
    version="1",
    key=("episode_id",),
    partition_key="episode_id",
    arrow=pa.schema(
        [
            pa.field("episode_id", pa.string(), nullable=False),
            pa.field("passed", pa.bool_(), nullable=False),  # every flag below its threshold
            pa.field("flags", pa.list_(pa.string())),  # codes of the failed checks (qa.thresholds in conf)
            pa.field("reasons", pa.list_(pa.string())),  # one human-readable sentence per flag
            pa.field("frames", pa.int64()),
            pa.field("duration_s", pa.float64()),
            pa.field("posed_fraction", pa.float32()),  # frames with a camera pose not interpolated or lost
            pa.field("hand_coverage", pa.float32()),  # frames with at least one wearer hand
            pa.field("identity_switches", pa.int32()),
            pa.field("scale_source", pa.string()),
            pa.field("report_path", pa.string()),  # the episode's HTML page under OUTPUT/qa
        ]
    ),
)
